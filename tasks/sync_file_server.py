"""Step 3: sync the data set from Blob to the file server, incrementally, verified, atomically for readers.

Files whose path and SHA-256 are unchanged since the current version are hard-linked from it; only
the shards that hold missing or changed files are downloaded; each extracted file is checked
against the manifest; the new version appears (as `current`) only once whole. The decision and the
versions are trainer/datasets.py's, which the sync job on an Azure ML cluster runs too.
"""

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra.backends import Pool, run_job
from infra.blobstore import BlobStore, StorageConfig, StorageError, open_store
from infra.errors import BadInput
from infra.fileserver import FileServer
from infra import manifest as mf
from infra.transfers import Transfer, in_parallel, step_plan, transfer_progress
from tasks.retry import unless_permanent
from trainer.datasets import SyncPlan, decide_sync, link_unchanged


def read_manifest(store: BlobStore, name: str) -> dict:
    """The data set's manifest, or BadInput when it was never (completely) staged."""
    text = store.read_text(mf.manifest_blob(name))
    if text is None:
        raise BadInput(f"data set {name!r} was never staged: {store.where} has no {mf.manifest_blob(name)}; "
                       "run `trainflow stage` first")
    return mf.parse_manifest(text)


def sync_row(plan: SyncPlan, name: str) -> dict:
    """The step's decision, as the dry run and the step's summary show it."""
    version = plan.manifest["version"][:12]
    if plan.complete:
        return step_plan("sync-to-file-server", "skip", f"{name}: the file server holds version {version}", files=0)
    files = sum(map(len, plan.needed.values()))
    return step_plan("sync-to-file-server", "run", f"{name}: fetch {files} files from {len(plan.needed)} shards, "
                     f"link {len(plan.reused)} unchanged, as version {version}", files=files)


def sync_to_file_server(store: BlobStore, server: FileServer, name: str, workdir: Path) -> tuple[Transfer, Path]:
    """Make server's `current` version of `name` equal the manifest in Blob."""
    plan = decide_sync(server, name, read_manifest(store, name))
    manifest, transfer = plan.manifest, Transfer("blob -> file server", plan=sync_row(plan, name))
    if plan.complete:
        server.activate(name, manifest["version"])
        transfer.skipped_files, transfer.skipped_bytes = len(manifest["files"]), manifest["bytes"]
        return transfer, server.current(name)
    with server.new_version(name, manifest) as dest:
        if plan.reused:
            link_unchanged(server.current_manifest(name)[0], plan.reused, dest)
        transfer.skipped_files = len(plan.reused)
        transfer.skipped_bytes = sum(f["size"] for f in manifest["files"] if f["path"] in plan.reused)
        total = sum(e.size for group in plan.needed.values() for e in group.values())
        with transfer_progress(transfer, total, sum(map(len, plan.needed.values()))) as advance:
            fetch_shards(store, name, plan.needed, dest, workdir, advance)
        bad = mf.sizes_match(dest, manifest["files"])
        if bad:
            raise StorageError(f"{len(bad)} files are missing after the sync, e.g. {bad[0]}")
    return transfer, server.current(name)


def fetch_shards(store: BlobStore, name: str, needed: dict, dest: Path, workdir: Path, advance) -> None:
    """Download each needed shard to a temporary file and extract the wanted, verified members."""

    def fetch(sid: str, wanted: dict[str, mf.FileEntry], tmp: Path) -> None:
        store.download_to(mf.shard_blob(name, sid), tmp / "shard.tar")
        try:
            advance(mf.extract_members(tmp / "shard.tar", wanted, dest), len(wanted))
        except ValueError as exc:  # a damaged download: the step's retry fetches it again
            raise StorageError(f"shard {sid} of {name} does not match the manifest ({exc})") from None

    in_parallel(needed, fetch, workdir / "tmp", store.concurrency)


@task(name="sync-to-file-server", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=unless_permanent)
def sync_to_file_server_task(cfg: StorageConfig, azurite_port: int | None, export: Path, name: str, workdir: Path) -> dict:
    """Prefect step: sync; returns the transfer summary and the folder training reads."""
    transfer, current = sync_to_file_server(open_store(cfg, azurite_port, "read"), FileServer(export), name, workdir)
    return {**transfer.row(), "path": str(current), "plan": transfer.plan}


@task(name="sync-to-file-server", retries=1, retry_delay_seconds=10, retry_condition_fn=unless_permanent,
      cache_policy=NO_CACHE)
def sync_on_pool_task(pool: Pool, name: str, timeout_s: float) -> dict:
    """Prefect step, where only the pool reaches the file server (an NFS share inside a VNet): the pool's own
    sync job (trainer/datasets.py on one node) brings it to the staged version while the flow waits."""
    pool.create()
    pool.wait_until_ready()
    job = pool.sync_job()
    logger = get_run_logger()
    run_job(job, pool.run.out / "logs" / "sync", logger.info, timeout_s)
    transfer = Transfer(f"blob -> file server (the pool's sync job {job.name})",
                        plan=step_plan("sync-to-file-server", "run", f"{name}: {job.describe()}"))
    return {**transfer.row(), "path": pool.synced_folder(), "plan": transfer.plan, "attempts": job.attempts()}
