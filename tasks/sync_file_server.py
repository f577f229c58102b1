"""Step 3: sync the data set from Blob to the file server, incrementally, verified, atomically for readers.

Files whose path and SHA-256 are unchanged since the current version are hard-linked from it; only
the shards that hold missing or changed files are downloaded; each extracted file is checked
against the manifest; the new version appears (as `current`) only once whole. The decision and the
versions are nodelib/staged/'s, which the sync job on an Azure ML cluster runs too. A disk too small for the
files to extract is refused before the first (fill_version); one that fills meanwhile ends the step in one line.
"""

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Protocol, cast

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra.compute import Pool, RunPaths, run_job
from infra.compute.base import Job
from infra.core.diskspace import writing
from infra.core.errors import BadInput
from infra.data import manifest as mf
from infra.storage.blobstore import BlobStore, open_store
from infra.storage.config import StorageConfig
from infra.storage.errors import StorageError
from infra.storage.fileserver import FileServer
from infra.storage.transfers import Transfer, step_plan, transfer_progress
from nodelib.errors import UntrustedInput
from nodelib.staged.manifest import Manifest
from nodelib.staged.versions import SyncPlan, decide_sync, fill_version
from tasks.retry import unless_permanent


@contextmanager
def staged_manifest(store: BlobStore, name: str, workdir: Path) -> Iterator[Manifest]:
    """The data set's manifest, downloaded and indexed under the workdir's tmp/ for the block; BadInput when it was
    never (completely) staged."""
    if store.metadata(mf.manifest_blob(name)) is None:
        raise BadInput(
            f"data set {name!r} was never staged: {store.where} has no {mf.manifest_blob(name)}; "
            "run `trainflow stage` first"
        )
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir / "tmp") as tmp:
        with writing(Path(tmp) / "manifest.jsonl", partial=Path(tmp) / "manifest.jsonl"):
            store.download_to(mf.manifest_blob(name), Path(tmp) / "manifest.jsonl")
        with Manifest.load(Path(tmp) / "manifest.jsonl", Path(tmp) / "manifest.db", name) as manifest:
            yield manifest


def sync_row(plan: SyncPlan, name: str) -> dict:
    """The step's decision, as the dry run and the step's summary show it."""
    version = plan.manifest.version[:12]
    if plan.complete:
        return step_plan("sync-to-file-server", "skip", f"{name}: the file server holds version {version}", files=0)
    files = sum(plan.needed.values())
    return step_plan(
        "sync-to-file-server",
        "run",
        f"{name}: fetch {files} files from {len(plan.needed)} shards, "
        f"link {plan.reused} unchanged, as version {version}",
        files=files,
    )


def sync_to_file_server(store: BlobStore, server: FileServer, name: str, workdir: Path) -> tuple[Transfer, Path]:
    """Make server's `current` version of `name` equal the manifest in Blob; a manifest or shard that breaks the
    format's rules (nodelib/staged/rules.py) is bad input, never retried, and leaves no version behind."""
    try:
        return synced(store, server, name, workdir)
    except UntrustedInput as exc:
        raise BadInput(str(exc)) from None


def synced(store: BlobStore, server: FileServer, name: str, workdir: Path) -> tuple[Transfer, Path]:
    """sync_to_file_server's work."""
    transfer = Transfer("blob -> file server")
    with ExitStack() as stack:
        with transfer.timed("manifest"):
            manifest = stack.enter_context(staged_manifest(store, name, workdir))
            plan = decide_sync(server, name, manifest)
        transfer.plan = sync_row(plan, name)
        if plan.complete:
            server.activate(name, manifest.version)
            transfer.skipped_files, transfer.skipped_bytes = manifest.header["files"], manifest.header["bytes"]
            return transfer, server.current(name)
        transfer.skipped_files, transfer.skipped_bytes = plan.reused, plan.reused_bytes()
        with (
            transfer.timed("link + fetch + extract"),
            server.new_version(name, manifest) as dest,
            transfer_progress(transfer, plan.needed_bytes(), sum(plan.needed.values())) as advance,
        ):
            try:
                fill_version(plan, dest, shard_fetcher(store, name, dest, workdir, advance), store.concurrency)
            except ValueError as exc:
                raise StorageError(str(exc)) from None
    return transfer, server.current(name)


def shard_fetcher(store: BlobStore, name: str, dest: Path, workdir: Path, advance):
    """fetch(shard, wanted): download one shard to a temporary file and extract the wanted, verified members."""

    def fetch(sid: str, wanted: Iterator[mf.FileEntry]) -> None:
        with tempfile.TemporaryDirectory(dir=workdir / "tmp") as tmp:
            with writing(Path(tmp) / "shard.tar", partial=Path(tmp) / "shard.tar"):
                store.download_to(mf.shard_blob(name, sid), Path(tmp) / "shard.tar")
            # a member unlike its row is UntrustedInput (the blob itself differs: another download reads the same)
            advance(*mf.extract_members(Path(tmp) / "shard.tar", wanted, dest, mf.shard_blob(name, sid)))

    return fetch


@task(name="sync-to-file-server", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=unless_permanent)
def sync_to_file_server_task(
    cfg: StorageConfig, azurite_port: int | None, export: Path, name: str, workdir: Path
) -> dict:
    """Prefect step: sync; returns the transfer summary and the folder training reads."""
    transfer, current = sync_to_file_server(open_store(cfg, azurite_port, "read"), FileServer(export), name, workdir)
    return {**transfer.row(), "path": str(current), "plan": transfer.plan}


class NamedJob(Job, Protocol):
    """A job that names the attempt it runs."""

    @property
    def name(self) -> str: ...


class SyncingPool(Pool, Protocol):
    """A pool whose backend syncs Blob to the file server by a job of its own (its sync_where is "pool")."""

    @property
    def run(self) -> RunPaths: ...

    def sync_job(self) -> NamedJob: ...

    def synced_folder(self) -> str: ...


@task(
    name="sync-to-file-server",
    retries=1,
    retry_delay_seconds=10,
    retry_condition_fn=unless_permanent,
    cache_policy=NO_CACHE,
)
def sync_on_pool_task(pool: Pool, name: str, timeout_s: float) -> dict:
    """Prefect step, where only the pool reaches the file server (an NFS share inside a VNet): the pool's own
    sync job (nodelib/staged/fetch.py on one node) brings it to the staged version while the flow waits."""
    pool = cast(SyncingPool, pool)  # the step runs only where the backend syncs on its pool (nothing here names one)
    pool.create()
    pool.wait_until_ready()
    job = pool.sync_job()
    logger = get_run_logger()
    run_job(job, pool.run.out / "logs" / "sync", logger.info, timeout_s)
    transfer = Transfer(
        f"blob -> file server (the pool's sync job {job.name})",
        plan=step_plan("sync-to-file-server", "run", f"{name}: {job.describe()}"),
    )
    return {**transfer.row(), "path": pool.synced_folder(), "plan": transfer.plan, "attempts": job.attempts()}
