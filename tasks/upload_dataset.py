"""Step 2: write the data set to Blob storage as large tar shards, in parallel, manifest last.

Re-running with unchanged data uploads nothing; changing one file re-uploads only its shard; a run
that crashed resumes without re-sending the shards already stored (a blob exists only once whole).
"""

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prefect import task

from infra.azurite import connection_string
from infra.blobstore import BlobStore, StorageConfig, StorageError
from infra.launcher import index_data
from tasks import manifest as mf
from tasks.progress import Transfer, in_parallel, transfer_progress
from tasks.retry import unless_permanent


def scan_dataset(data_dir: Path, cache: dict) -> tuple[list[mf.FileEntry], list[str], dict]:
    """Hash every file (cached by size and mtime); returns the entries, the new or changed paths, the cache."""
    paths = mf.relative_paths(data_dir)
    mf.check_names(paths)
    return mf.hash_files(data_dir, paths, cache)


def check_images(data_dir: Path, fresh: list[str]) -> None:
    """Check that the new or changed files are images (headers only: staging moves bytes, verified
    by checksum end to end; the training step's check decodes every pixel before workers start)."""
    if fresh:
        index_data(data_dir, verify=fresh, headers_only=True)


def plan_shards(entries: list[mf.FileEntry], previous: dict | None, shard_bytes: int,
                parallel: int) -> tuple[dict[str, list[mf.FileEntry]], int]:
    """Shards for the data set and their bucket count, keeping the previous count while sizes allow."""
    total = sum(e.size for e in entries)
    count = mf.shard_count(total, shard_bytes, previous and previous.get("shard_count"), parallel)
    return mf.assign_shards(entries, count), count


@dataclass
class UploadPlan:
    """What the container holds, and what this run must send."""

    shards: dict[str, list[mf.FileEntry]]
    stored: dict[str, int]  # shard blobs already in the container
    previous: str | None  # the manifest text in the container, if any
    manifest: dict

    def unreferenced(self, name: str) -> set[str]:
        """Stored shards that neither this manifest nor the previous one uses (a sync that read the
        previous manifest may still be fetching its shards)."""
        keep = {f["shard"] for f in self.manifest["files"]}
        if self.previous:
            keep |= {f["shard"] for f in mf.parse_manifest(self.previous)["files"]}
        return set(self.stored) - {mf.shard_blob(name, sid) for sid in keep}

    def todo(self, name: str) -> dict[str, list[mf.FileEntry]]:
        """The shards the container lacks."""
        return {sid: f for sid, f in self.shards.items() if mf.shard_blob(name, sid) not in self.stored}


def plan_upload(store: BlobStore, cfg: StorageConfig, name: str, entries: list[mf.FileEntry]) -> UploadPlan:
    """Read the container's state and plan the shards."""
    store.ensure_container()
    previous = store.read_text(mf.manifest_blob(name))
    shards, count = plan_shards(entries, mf.parse_manifest(previous) if previous else None,
                                int(cfg.shard_mb * (1 << 20)), cfg.upload_concurrency)
    stored = store.names(mf.dataset_prefix(name) + "shards/")
    return UploadPlan(shards, stored, previous, mf.build_manifest(name, shards, count))


def upload_dataset(store: BlobStore, cfg: StorageConfig, data_dir: Path, name: str, workdir: Path) -> Transfer:
    """Pack, upload the missing shards in parallel, write the manifest, drop unreferenced shards.

    The image check of new files runs while shards upload; the manifest is written only if it passes.
    """
    cache_file = workdir / "cache" / f"hashes-{name}.json"
    entries, fresh, cache = scan_dataset(data_dir, mf.load_cache(cache_file))
    plan = plan_upload(store, cfg, name, entries)
    todo, transfer = plan.todo(name), Transfer("data set -> blob")
    transfer.skipped_files = sum(len(f) for sid, f in plan.shards.items() if sid not in todo)
    transfer.skipped_bytes = sum(e.size for sid, f in plan.shards.items() if sid not in todo for e in f)
    with ThreadPoolExecutor(max_workers=1) as checker:
        images_ok = checker.submit(check_images, data_dir, fresh)
        with transfer_progress(transfer, sum(e.size for f in todo.values() for e in f),
                               sum(map(len, todo.values()))) as advance:
            send_shards(store, data_dir, name, todo, workdir, advance, stop=lambda: failed(images_ok))
        images_ok.result()
    text = mf.manifest_bytes(plan.manifest).decode()
    if plan.previous != text:
        store.write_text(mf.manifest_blob(name), text)  # last: from now on the data set is complete
    mf.save_cache(cache_file, cache)
    for blob in plan.unreferenced(name):
        store.delete(blob)
    transfer.notes.append(f"{len(plan.shards)} shards, {len(todo)} uploaded, version {plan.manifest['version'][:12]}")
    return transfer


def failed(check: Future) -> bool:
    """Whether a background check has already failed."""
    return check.done() and check.exception() is not None


def send_shards(store: BlobStore, data_dir: Path, name: str, todo: dict, workdir: Path, advance, stop) -> None:
    """Build each shard in a temporary file and upload it, store.concurrency at a time, until stop()."""

    def send(sid: str, files: list[mf.FileEntry], tmp: Path) -> None:
        if stop():
            return  # the image check failed: the error comes from it
        mf.write_shard(data_dir, files, tmp / "shard.tar")
        store.upload_file(tmp / "shard.tar", mf.shard_blob(name, sid), metadata={"files": str(len(files))})
        advance(sum(e.size for e in files), len(files))

    in_parallel(todo, send, workdir / "tmp", store.concurrency)


@task(name="upload-dataset", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=unless_permanent)
def upload_dataset_task(cfg: StorageConfig, azurite_port: int | None, data_dir: Path, name: str, workdir: Path) -> dict:
    """Prefect step: upload the data set; returns the transfer summary."""
    store = connect(cfg, azurite_port)
    return upload_dataset(store, cfg, data_dir, name, workdir).row()


def connect(cfg: StorageConfig, azurite_port: int | None, access: str = "stage") -> BlobStore:
    """The blob store of the config (Azurite on `azurite_port` for the local default), for `access`."""
    if cfg.backend == "azurite" and azurite_port is None:
        raise StorageError("Azurite's port is unknown: the flow starts Azurite before staging", permanent=True)
    return BlobStore.connect(cfg, connection_string=connection_string(azurite_port) if azurite_port else None,
                             access=access)
