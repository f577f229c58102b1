"""Step 3: sync the data set from Blob to the file server, incrementally, verified, atomically for readers.

Files whose path and SHA-256 are unchanged since the current version are hard-linked from it; only
the shards that hold missing or changed files are downloaded; each extracted file is checked
against the manifest; the new version appears (as `current`) only once whole.
"""

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from prefect import task

from infra.blobstore import BlobStore, StorageConfig, StorageError, open_store
from infra.errors import BadInput
from infra.fileserver import FileServer
from infra import manifest as mf
from infra.transfers import Transfer, in_parallel, step_plan, transfer_progress
from tasks.retry import unless_permanent


def read_manifest(store: BlobStore, name: str) -> dict:
    """The data set's manifest, or BadInput when it was never (completely) staged."""
    text = store.read_text(mf.manifest_blob(name))
    if text is None:
        raise BadInput(f"data set {name!r} was never staged: {store.where} has no {mf.manifest_blob(name)}; "
                       "run `trainflow stage` first")
    return mf.parse_manifest(text)


@dataclass
class SyncPlan:
    """What the sync of one manifest does: nothing (the file server has that version), or link what the
    current version already holds and fetch the rest by shard."""

    manifest: dict
    complete: bool  # the file server already holds this version whole
    reused: set[str]  # paths hard-linked from the current version
    needed: dict[str, dict[str, mf.FileEntry]]  # shard -> the files to extract from it

    def row(self, name: str) -> dict:
        """The step's decision."""
        version = self.manifest["version"][:12]
        if self.complete:
            return step_plan("sync-to-file-server", "skip", f"{name}: the file server holds version {version}",
                             files=0)
        files = sum(map(len, self.needed.values()))
        return step_plan("sync-to-file-server", "run", f"{name}: fetch {files} files from {len(self.needed)} shards, "
                         f"link {len(self.reused)} unchanged, as version {version}", files=files)


def decide_sync(server: FileServer, name: str, manifest: dict) -> SyncPlan:
    """The sync's decision for `manifest`: the step and the dry run share it."""
    if server.is_complete(name, manifest["version"]):
        return SyncPlan(manifest, True, set(), {})
    current = server.current_manifest(name)
    old = {f["path"]: f["sha256"] for f in current[1]["files"]} if current else {}
    reused = {f["path"] for f in manifest["files"] if old.get(f["path"]) == f["sha256"]}
    needed: dict[str, dict[str, mf.FileEntry]] = {}
    for f in manifest["files"]:
        if f["path"] not in reused:
            needed.setdefault(f["shard"], {})[f["path"]] = mf.FileEntry(f["path"], f["size"], f["sha256"])
    return SyncPlan(manifest, False, reused, needed)


def link_unchanged(folder: Path, reused: set[str], dest: Path) -> None:
    """Hard-link (or copy) the reused files of the current version `folder` into the new version `dest`."""
    for rel in reused:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(folder / rel, dest / rel)
        except OSError:
            shutil.copyfile(folder / rel, dest / rel)


def sync_to_file_server(store: BlobStore, server: FileServer, name: str, workdir: Path) -> tuple[Transfer, Path]:
    """Make server's `current` version of `name` equal the manifest in Blob."""
    plan = decide_sync(server, name, read_manifest(store, name))
    manifest, transfer = plan.manifest, Transfer("blob -> file server", plan=plan.row(name))
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
