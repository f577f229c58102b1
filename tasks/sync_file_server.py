"""Step 3: sync the data set from Blob to the file server, incrementally, verified, atomically for readers.

Files whose path and SHA-256 are unchanged since the current version are hard-linked from it; only
the shards that hold missing or changed files are downloaded; each extracted file is checked
against the manifest; the new version appears (as `current`) only once whole.
"""

import os
import shutil
from pathlib import Path

from prefect import task

from infra.blobstore import BlobStore, StorageConfig, StorageError
from infra.fileserver import FileServer
from infra.launcher import BadInput
from tasks import manifest as mf
from tasks.progress import Transfer, in_parallel, transfer_progress
from tasks.retry import unless_permanent
from tasks.upload_dataset import connect


def read_manifest(store: BlobStore, name: str) -> dict:
    """The data set's manifest, or BadInput when it was never (completely) staged."""
    text = store.read_text(mf.manifest_blob(name))
    if text is None:
        raise BadInput(f"data set {name!r} was never staged: {store.where} has no {mf.manifest_blob(name)}; "
                       "run `trainflow stage` first")
    return mf.parse_manifest(text)


def reuse_unchanged(previous: tuple[Path, dict] | None, files: list[dict], dest: Path) -> set[str]:
    """Hard-link files that the current version already holds with the same content; returns their paths."""
    if previous is None:
        return set()
    folder, old = previous
    same = {f["path"] for f in old["files"]} & {f["path"] for f in files}
    old_hash = {f["path"]: f["sha256"] for f in old["files"]}
    reused = {f["path"] for f in files if f["path"] in same and old_hash[f["path"]] == f["sha256"]}
    for rel in reused:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(folder / rel, dest / rel)
        except OSError:
            shutil.copyfile(folder / rel, dest / rel)
    return reused


def sync_to_file_server(store: BlobStore, server: FileServer, name: str, workdir: Path) -> tuple[Transfer, Path]:
    """Make server's `current` version of `name` equal the manifest in Blob."""
    manifest, transfer = read_manifest(store, name), Transfer("blob -> file server")
    if server.is_complete(name, manifest["version"]):
        server.activate(name, manifest["version"])
        transfer.skipped_files, transfer.skipped_bytes = len(manifest["files"]), manifest["bytes"]
        return transfer, server.current(name)
    with server.new_version(name, manifest) as dest:
        reused = reuse_unchanged(server.current_manifest(name), manifest["files"], dest)
        needed: dict[str, dict[str, mf.FileEntry]] = {}
        for f in manifest["files"]:
            if f["path"] not in reused:
                needed.setdefault(f["shard"], {})[f["path"]] = mf.FileEntry(f["path"], f["size"], f["sha256"])
        transfer.skipped_files = len(reused)
        transfer.skipped_bytes = sum(f["size"] for f in manifest["files"] if f["path"] in reused)
        total = sum(e.size for group in needed.values() for e in group.values())
        with transfer_progress(transfer, total, sum(map(len, needed.values()))) as advance:
            fetch_shards(store, name, needed, dest, workdir, advance)
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
    transfer, current = sync_to_file_server(connect(cfg, azurite_port, "read"), FileServer(export), name, workdir)
    return {**transfer.row(), "path": str(current)}
