"""Step 2: write the data set to Blob storage as large tar shards, in parallel, manifest last.

Re-running with unchanged data uploads nothing; changing one file re-uploads only its shard; a run
that crashed resumes without re-sending the shards already stored (a blob exists only once whole).
"""

import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prefect import task

from infra.blobstore import BlobStore, StorageConfig, StorageError
from infra.launcher import BadInput, index_data
from tasks import manifest as mf
from tasks.progress import Transfer, transfer_progress
from tasks.retry import unless_permanent


def relative_paths(data_dir: Path) -> list[str]:
    """Every image of the data set, relative to data_dir, as the training engine lists them."""
    index = index_data(data_dir)
    prefix = str(data_dir).rstrip("/") + "/"
    return [p.removeprefix(prefix) for p, _ in index["train"] + (index["val"] or [])]


def check_names(paths: list[str]) -> None:
    """Two names that differ only in case would collide on a case-insensitive file system."""
    clashes = mf.case_clashes(paths)
    if clashes:
        a, b = clashes[0]
        raise BadInput(f"{a!r} and {b!r} differ only in letter case ({len(clashes)} such pairs); rename one of each")


def scan_dataset(data_dir: Path, cache_file: Path) -> tuple[list[mf.FileEntry], list[str]]:
    """Hash every file (cached by size and mtime); returns the entries and the new or changed paths."""
    paths = relative_paths(data_dir)
    check_names(paths)
    return mf.hash_files(data_dir, paths, cache_file)


def check_images(data_dir: Path, fresh: list[str], cache_file: Path) -> None:
    """Check that the new or changed files are images (headers only: staging moves bytes, verified
    by checksum end to end; the training step's check decodes every pixel before workers start)."""
    if not fresh:
        return
    try:
        index_data(data_dir, verify=fresh, headers_only=True)
    except BadInput:
        cache_file.unlink(missing_ok=True)  # the next run must check these files again
        raise


def plan_shards(entries: list[mf.FileEntry], previous: dict | None, shard_bytes: int,
                parallel: int) -> dict[str, list[mf.FileEntry]]:
    """Shards for the data set, keeping the previous shard count while sizes allow."""
    total = sum(e.size for e in entries)
    count = mf.shard_count(total, shard_bytes, previous and previous.get("shard_count"), parallel)
    return mf.assign_shards(entries, count)


@dataclass
class UploadPlan:
    """What the container holds, and what this run must send."""

    shards: dict[str, list[mf.FileEntry]]
    stored: dict[str, int]  # shard blobs already in the container
    previous: str | None  # the manifest text in the container, if any
    manifest: dict

    def todo(self, name: str) -> dict[str, list[mf.FileEntry]]:
        """The shards the container lacks."""
        return {sid: f for sid, f in self.shards.items() if mf.shard_blob(name, sid) not in self.stored}


def plan_upload(store: BlobStore, cfg: StorageConfig, name: str, entries: list[mf.FileEntry]) -> UploadPlan:
    """Read the container's state and plan the shards."""
    store.ensure_container()
    previous = store.read_text(mf.manifest_blob(name))
    shards = plan_shards(entries, mf.parse_manifest(previous) if previous else None, int(cfg.shard_mb * (1 << 20)),
                         cfg.upload_concurrency)
    stored = store.names(mf.dataset_prefix(name) + "shards/")
    return UploadPlan(shards, stored, previous, mf.build_manifest(name, shards))


def upload_dataset(store: BlobStore, cfg: StorageConfig, data_dir: Path, name: str, workdir: Path) -> Transfer:
    """Pack, upload the missing shards in parallel, write the manifest, drop unreferenced shards.

    The image check of new files runs while shards upload; the manifest is written only if it passes.
    """
    cache_file = workdir / "cache" / f"hashes-{name}.json"
    entries, fresh = scan_dataset(data_dir, cache_file)
    plan = plan_upload(store, cfg, name, entries)
    todo, transfer = plan.todo(name), Transfer("data set -> blob")
    transfer.skipped_files = sum(len(f) for sid, f in plan.shards.items() if sid not in todo)
    transfer.skipped_bytes = sum(e.size for sid, f in plan.shards.items() if sid not in todo for e in f)
    with ThreadPoolExecutor(max_workers=1) as checker:
        images_ok = checker.submit(check_images, data_dir, fresh, cache_file)
        with transfer_progress(transfer, sum(e.size for f in todo.values() for e in f),
                               sum(map(len, todo.values()))) as advance:
            send_shards(store, data_dir, name, todo, workdir, advance)
        images_ok.result()
    text = mf.manifest_bytes(plan.manifest).decode()
    if plan.previous != text:
        store.write_text(mf.manifest_blob(name), text)  # last: from now on the data set is complete
    for blob in set(plan.stored) - {mf.shard_blob(name, sid) for sid in plan.shards}:
        store.delete(blob)  # shards of files that changed: no manifest refers to them any more
    transfer.notes.append(f"{len(plan.shards)} shards, {len(todo)} uploaded, version {plan.manifest['version'][:12]}")
    return transfer


def send_shards(store: BlobStore, data_dir: Path, name: str, todo: dict, workdir: Path, advance) -> None:
    """Build each shard in a temporary file and upload it; store.concurrency at a time."""
    tmp_root = workdir / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)

    def send(item):
        sid, files = item
        with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
            tar = Path(tmp) / f"{sid}.tar"
            mf.write_shard(data_dir, files, tar)
            store.upload_file(tar, mf.shard_blob(name, sid), metadata={"files": str(len(files))})
        advance(sum(e.size for e in files), len(files))

    with ThreadPoolExecutor(max_workers=store.concurrency) as pool:
        list(pool.map(send, todo.items()))


@task(name="upload-dataset", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=unless_permanent)
def upload_dataset_task(cfg: StorageConfig, azurite_port: int | None, data_dir: Path, name: str, workdir: Path) -> dict:
    """Prefect step: upload the data set; returns the transfer summary."""
    store = connect(cfg, azurite_port)
    return upload_dataset(store, cfg, data_dir, name, workdir).row()


def connect(cfg: StorageConfig, azurite_port: int | None) -> BlobStore:
    """The blob store of the config (Azurite on `azurite_port` for the local default)."""
    from infra.azurite import connection_string

    if cfg.backend == "azurite" and azurite_port is None:
        raise StorageError("Azurite's port is unknown: the flow starts Azurite before staging", permanent=True)
    return BlobStore.connect(cfg, connection_string=connection_string(azurite_port) if azurite_port else None)
