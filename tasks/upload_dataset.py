"""Step 2: write the data set to Blob storage as large tar shards, in parallel, manifest last.

Re-running with unchanged data uploads nothing; changing one file re-uploads only its shard; a run
that crashed resumes without re-sending the shards already stored (a blob exists only once whole).
"""

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prefect import task

from infra.blobstore import BlobStore, StorageConfig, open_store
from infra.jsonfiles import read_json, write_json
from infra.trainer import index_data
from infra import manifest as mf
from infra.transfers import Transfer, in_parallel, step_plan, transfer_progress
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
    stored: set[str]  # shard blobs already in the container
    previous: dict | None  # the manifest in the container, if any
    manifest: dict

    def unreferenced(self, name: str) -> set[str]:
        """Stored shards that neither this manifest nor the previous one uses (a sync that read the
        previous manifest may still be fetching its shards)."""
        keep = {f["shard"] for f in self.manifest["files"]}
        if self.previous:
            keep |= {f["shard"] for f in self.previous["files"]}
        return set(self.stored) - {mf.shard_blob(name, sid) for sid in keep}

    def todo(self, name: str) -> dict[str, list[mf.FileEntry]]:
        """The shards the container lacks."""
        return {sid: f for sid, f in self.shards.items() if mf.shard_blob(name, sid) not in self.stored}

    def row(self, name: str) -> dict:
        """The step's decision: what it sends, or why it sends nothing."""
        todo, total = self.todo(name), len(self.manifest["files"])
        files = sum(map(len, todo.values()))
        if not todo and self.previous and self.previous["version"] == self.manifest["version"]:
            return step_plan("upload-dataset", "skip", f"{name}: Blob holds all {total} files (version "
                             f"{self.manifest['version'][:12]})", files=0)
        return step_plan("upload-dataset", "run", f"{name}: upload {files} of {total} files in {len(todo)} of "
                         f"{len(self.shards)} shards", files=files)


def decide_upload(cfg: StorageConfig, name: str, entries: list[mf.FileEntry], previous: dict | None,
                  stored: set[str]) -> UploadPlan:
    """The shards of `entries`, given the container's manifest and shard blobs: the step and the dry run share it."""
    shards, count = plan_shards(entries, previous, int(cfg.shard_mb * (1 << 20)), cfg.upload_concurrency)
    return UploadPlan(shards, stored, previous, mf.build_manifest(name, shards, count))


def plan_upload(store: BlobStore, cfg: StorageConfig, name: str, entries: list[mf.FileEntry]) -> UploadPlan:
    """Read the container's state and plan the shards."""
    store.ensure_container()
    previous = store.read_text(mf.manifest_blob(name))
    stored = set(store.names(mf.dataset_prefix(name) + "shards/"))
    return decide_upload(cfg, name, entries, mf.parse_manifest(previous) if previous else None, stored)


def plan_upload_offline(cfg: StorageConfig, data_dir: Path, name: str, workdir: Path,
                        synced: dict | None) -> UploadPlan:
    """The plan for the dry run, which reaches no storage: the container as the file server's copy `synced`
    (the manifest its last sync read) shows it, the files hashed with the step's cache (not written)."""
    entries = scan_dataset(data_dir, read_json(cache_path(workdir, name)))[0]
    stored = {mf.shard_blob(name, f["shard"]) for f in synced["files"]} if synced else set()
    return decide_upload(cfg, name, entries, synced, stored)


def cache_path(workdir: Path, name: str) -> Path:
    """The hash cache of a data set's files."""
    return workdir / "cache" / f"hashes-{name}.json"


def upload_dataset(store: BlobStore, cfg: StorageConfig, data_dir: Path, name: str, workdir: Path) -> Transfer:
    """Pack, upload the missing shards in parallel, write the manifest, drop unreferenced shards.

    The image check of new files runs while shards upload; the manifest is written only if it passes.
    """
    cache_file = cache_path(workdir, name)
    entries, fresh, cache = scan_dataset(data_dir, read_json(cache_file))
    plan = plan_upload(store, cfg, name, entries)
    todo, transfer = plan.todo(name), Transfer("data set -> blob", plan=plan.row(name))
    transfer.skipped_files = sum(len(f) for sid, f in plan.shards.items() if sid not in todo)
    transfer.skipped_bytes = sum(e.size for sid, f in plan.shards.items() if sid not in todo for e in f)
    with ThreadPoolExecutor(max_workers=1) as checker:
        images_ok = checker.submit(check_images, data_dir, fresh)
        with transfer_progress(transfer, sum(e.size for f in todo.values() for e in f),
                               sum(map(len, todo.values()))) as advance:
            send_shards(store, data_dir, name, todo, workdir, advance, stop=lambda: failed(images_ok))
        images_ok.result()
    text = mf.manifest_bytes(plan.manifest).decode()
    if plan.previous is None or mf.manifest_bytes(plan.previous).decode() != text:
        store.write_text(mf.manifest_blob(name), text)  # last: from now on the data set is complete
    write_json(cache_file, cache)
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
    transfer = upload_dataset(open_store(cfg, azurite_port), cfg, data_dir, name, workdir)
    return {**transfer.row(), "plan": transfer.plan}

