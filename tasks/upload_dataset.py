"""Step 2: write the data set to Blob storage as large tar shards, in parallel, manifest last.

Re-running with unchanged data uploads nothing; changing one file re-uploads only its shard; a run
that crashed resumes without re-sending the shards already stored (a blob exists only once whole).
"""

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from infra.core.errors import BadInput
from infra.data import manifest as mf
from infra.storage.blobstore import BlobStore, StorageConfig, open_store
from infra.storage.transfers import Transfer, in_parallel, step_plan, transfer_progress
from tasks.retry import unless_permanent
from trainer.datasets import FORMAT, Manifest
from trainer.errors import UsageError
from trainer.layout import bad_image_lines, bad_images_error, find_bad_images, write_bad_list


def cache_path(workdir: Path, name: str) -> Path:
    """The index of a data set's files kept between runs (hashes and image checks by size and mtime)."""
    return workdir / "cache" / f"index-{name}.sqlite"


@contextmanager
def scan_dataset(data_dir: Path, workdir: Path, name: str, keep: bool = True) -> Iterator[mf.Index]:
    """Index the folder: unchanged files (same size and mtime as in the last scan) keep their hash and image check;
    new or changed files are hashed and decoded once, here, where they enter. With `keep` the index is kept for
    the next run as soon as the scan is done (a run that then fails on bad files does not decode them again)."""
    cache = cache_path(workdir, name)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed} files"),
        TimeElapsedColumn(),
        transient=True,
    ) as progress:
        bar = progress.add_task(f"list, hash and check {data_dir}", total=None)
        with mf.scanned(data_dir, cache, find_bad_images, keep, lambda n: progress.advance(bar, n)) as (index, _):
            yield index


def bad_files_error(index: mf.Index, bad: list[tuple[str, str]], data_dir: Path, workdir: Path, name: str) -> BadInput:
    """The one error for a data set with bad images: the count, the first, and the list file (under the workdir);
    the first 20 are printed above it."""
    listing = write_bad_list(bad, workdir / "cache" / f"bad-files-{name}.tsv")
    Console(stderr=True, highlight=False).print("\n".join(bad_image_lines(bad)), markup=False, soft_wrap=True)
    error: UsageError = bad_images_error(bad, index.total()[0], listing, data_dir)
    return BadInput(str(error))


@dataclass
class UploadPlan:
    """What the container holds, and what this run must send."""

    index: mf.Index
    header: dict  # the new manifest's header
    stored: set[str]  # shard blobs already in the container
    previous: dict | None  # the stored manifest's metadata (version, shard_count, files), if any

    @property
    def version(self) -> str:
        return self.header["version"]

    def todo(self, name: str) -> dict[str, tuple[int, int]]:
        """The shards the container lacks, with their files and bytes."""
        return {sid: n for sid, n in self.index.shard_sizes().items() if mf.shard_blob(name, sid) not in self.stored}

    def unchanged(self) -> bool:
        """Whether the stored manifest already describes this data set."""
        return bool(self.previous and self.previous.get("version") == self.version)

    def row(self, name: str) -> dict:
        """The step's decision: what it sends, or why it sends nothing."""
        todo, total = self.todo(name), self.header["files"]
        files = sum(n for n, _ in todo.values())
        if not todo and self.unchanged():
            return step_plan(
                "upload-dataset", "skip", f"{name}: Blob holds all {total} files (version {self.version[:12]})", files=0
            )
        return step_plan(
            "upload-dataset",
            "run",
            f"{name}: upload {files} of {total} files in {len(todo)} of {len(self.index.shards)} shards",
            files=files,
        )


def decide_upload(
    cfg: StorageConfig, name: str, index: mf.Index, previous: dict | None, stored: set[str]
) -> UploadPlan:
    """The shards of the index, given the stored manifest's metadata and shard blobs: the step and the dry run
    share it. The previous shard count is kept while sizes allow (files stay in their shards)."""
    files, total = index.total()
    count = mf.shard_count(
        total, int(cfg.shard_mb * (1 << 20)), int(previous["shard_count"]) if previous else None, cfg.upload_concurrency
    )
    header = {
        "format": FORMAT,
        "dataset": name,
        "version": index.plan_shards(count),
        "shard_count": count,
        "files": files,
        "bytes": total,
        "verified": {"check": "decode", "bad": index.bad()},
    }
    return UploadPlan(index, header, stored, previous)


def plan_upload(store: BlobStore, cfg: StorageConfig, name: str, index: mf.Index) -> UploadPlan:
    """Read the container's state (the manifest's metadata, the shard names) and plan the shards."""
    store.ensure_container()
    stored = set(store.names(mf.dataset_prefix(name) + "shards/"))
    return decide_upload(cfg, name, index, store.metadata(mf.manifest_blob(name)), stored)


def synced_state(server_manifest: Path | None, name: str) -> tuple[dict | None, set[str]]:
    """The container as a stored manifest (`server_manifest`: the file server's current version, what its last sync
    read) shows it: the manifest's metadata and shard blobs. The dry run's stand-in for a container it does not
    reach, and the upload's record of which shards a sync may still be fetching."""
    if server_manifest is None:
        return None, set()
    with tempfile.TemporaryDirectory() as tmp, Manifest.load(server_manifest, Path(tmp) / "m.db") as synced:
        return manifest_metadata(synced.header), {mf.shard_blob(name, sid) for sid in synced.shards()}


def manifest_metadata(header: dict) -> dict[str, str]:
    """What the manifest blob's metadata says, so that a re-run compares one HEAD request, not the whole list."""
    return {"version": header["version"], "shard_count": str(header["shard_count"]), "files": str(header["files"])}


def upload_dataset(
    store: BlobStore, cfg: StorageConfig, data_dir: Path, name: str, workdir: Path, bad_files: str = "fail"
) -> Transfer:
    """Index (hash and check new files), pack and upload the missing shards in parallel, write the manifest, drop
    shards no manifest uses. Bad images fail the step with one error listing them all (`bad_files: fail`), or are
    recorded in the manifest for training to leave out (`skip`)."""
    transfer = Transfer("data set -> blob")
    with ExitStack() as stack:
        with transfer.timed("list + hash + check"):
            index = stack.enter_context(scan_dataset(data_dir, workdir, name))
        bad = index.bad()
        if bad and bad_files == "fail":
            raise bad_files_error(index, bad, data_dir, workdir, name)
        with transfer.timed("pack + upload"):
            plan = plan_upload(store, cfg, name, index)
            todo, transfer.plan = plan.todo(name), plan.row(name)
            counts = [sum(n for n, _ in todo.values()), sum(b for _, b in todo.values())]
            transfer.skipped_files, transfer.skipped_bytes = (
                plan.header["files"] - counts[0],
                plan.header["bytes"] - counts[1],
            )
            with transfer_progress(transfer, counts[1], counts[0]) as advance:
                send_shards(store, index, data_dir, name, todo, workdir, advance)
            doomed = unreferenced(store, plan, name, workdir)
        with transfer.timed("manifest"):
            if not plan.unchanged():
                path = mf.write_manifest(index, plan.header, workdir / "tmp" / f"manifest-{name}.jsonl")
                store.upload_file(path, mf.manifest_blob(name), metadata=manifest_metadata(plan.header))  # last
                path.unlink()
    for blob in doomed:
        store.delete(blob)
    transfer.notes.append(
        f"{len(index.shards)} shards, {len(todo)} uploaded, version {plan.version[:12]}"
        + (f", {len(bad)} bad images left out of training" if bad else "")
    )
    return transfer


def unreferenced(store: BlobStore, plan: UploadPlan, name: str, workdir: Path) -> set[str]:
    """Stored shards that neither the new manifest nor the stored one uses (a sync that read the stored manifest
    may still be fetching its shards). The stored manifest is read only when there is something to drop."""
    extra = plan.stored - {mf.shard_blob(name, sid) for sid in plan.index.shards.values()}
    if extra and plan.previous:
        (workdir / "tmp").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=workdir / "tmp") as tmp:
            store.download_to(mf.manifest_blob(name), Path(tmp) / "previous.jsonl")
            extra -= synced_state(Path(tmp) / "previous.jsonl", name)[1]
    return extra


def send_shards(
    store: BlobStore,
    index: mf.Index,
    data_dir: Path,
    name: str,
    todo: dict[str, tuple[int, int]],
    workdir: Path,
    advance,
) -> None:
    """Build each shard in a temporary file and upload it, store.concurrency at a time."""

    def send(sid: str, counts: tuple[int, int], tmp: Path) -> None:
        mf.write_shard(data_dir, index.shard_files(sid), tmp / "shard.tar")
        store.upload_file(tmp / "shard.tar", mf.shard_blob(name, sid), metadata={"files": str(counts[0])})
        advance(counts[1], counts[0])

    in_parallel(todo, send, workdir / "tmp", store.concurrency)


@task(name="upload-dataset", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=unless_permanent)
def upload_dataset_task(
    cfg: StorageConfig, azurite_port: int | None, data_dir: Path, name: str, workdir: Path, bad_files: str = "fail"
) -> dict:
    """Prefect step: upload the data set; returns the transfer summary."""
    transfer = upload_dataset(open_store(cfg, azurite_port), cfg, data_dir, name, workdir, bad_files)
    return {**transfer.row(), "plan": transfer.plan}
