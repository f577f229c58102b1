"""A staged data set and the file server's versions of it: what the sync writes and the nodes read.

Staged (in Blob, or a datastore folder that mounts it): `datasets/<name>/manifest.json` plus
`datasets/<name>/shards/<id>.tar`. The manifest lists every file (path, size, SHA-256, shard) and is
written last. On a file server (the NFS share, or a node's local disk):

    <export>/datasets/<name>/v-<version>/   one complete copy (train/, val/, .manifest.json)
    <export>/datasets/<name>/current        symlink to the newest complete version: what training reads

The orchestrator's sync (tasks/sync_file_server.py) and the node-side fetch below share this module,
so both write the same layout the same way. Run on a node, it needs only the standard library:

    python trainer/datasets.py --source <datastore mount of datasets/imagenet/> --export /mnt/fileserver --dataset imagenet

brings `<export>/datasets/imagenet/current` to the staged version: unchanged files are hard-linked from
the current version, the rest extracted from their shards and checked against the manifest; a lock in
the export makes the ranks of one node wait for the first one's fetch instead of repeating it.
"""

import argparse
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

FORMAT = 1
MANIFEST = ".manifest.json"  # a complete version's copy of its manifest, on the file server
MANIFEST_FILE = "manifest.json"  # the staged manifest, in the data set's folder
BAD_INPUT = "error: "  # how this command's bad-input lines begin


@dataclass(frozen=True)
class FileEntry:
    """One file of the data set."""

    path: str  # relative, "/"-separated: train/<class>/...
    size: int
    sha256: str


def dataset_prefix(name: str) -> str:
    """Where a data set lives in the container."""
    return f"datasets/{name}/"


def shard_file(shard: str) -> str:
    """One shard's path inside the data set's folder."""
    return f"shards/{shard}.tar"


def shard_blob(name: str, shard: str) -> str:
    """The blob name of one shard."""
    return dataset_prefix(name) + shard_file(shard)


def manifest_blob(name: str) -> str:
    """The blob name of the manifest, the data set's completion mark."""
    return f"{dataset_prefix(name)}{MANIFEST_FILE}"


def parse_manifest(text: str) -> dict:
    """A stored manifest, checked for its format."""
    manifest = json.loads(text)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"manifest format {manifest.get('format')} is not {FORMAT}")
    return manifest


def extract_members(tar_path: Path, wanted: dict[str, FileEntry], dest: Path) -> int:
    """Extract the `wanted` members into dest, checking each one's size and SHA-256; returns bytes written."""
    written, found = 0, set()
    with tarfile.open(tar_path, "r") as tar:
        for member in tar:
            entry = wanted.get(member.name)
            if entry is None or not member.isfile():
                continue
            found.add(member.name)
            data = tar.extractfile(member).read()
            if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
                raise ValueError(f"{member.name} in {tar_path.name} does not match the manifest")
            target = dest / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
            target.chmod(0o444)  # versions share files by hard link: nobody may edit one in place
            written += len(data)
    missing = set(wanted) - found
    if missing:
        raise ValueError(f"{tar_path.name} lacks {len(missing)} files of the manifest, e.g. {sorted(missing)[0]}")
    return written


def sizes_match(root: Path, files: list[dict]) -> list[str]:
    """Paths in `files` that are missing under root or differ in size (a cheap completeness check)."""
    bad = []
    for f in files:
        try:
            if os.stat(root / f["path"]).st_size != f["size"]:
                bad.append(f["path"])
        except FileNotFoundError:
            bad.append(f["path"])
    return bad


class FileServer:
    """Data set versions under one export folder; a version appears (as `current`) only once whole."""

    def __init__(self, export: Path):
        self.export = export

    def dataset_dir(self, name: str) -> Path:
        return self.export / "datasets" / name

    def current(self, name: str) -> Path:
        """The path training reads: always a complete version."""
        return self.dataset_dir(name) / "current"

    def version_dir(self, name: str, version: str) -> Path:
        return self.dataset_dir(name) / f"v-{version}"

    def is_complete(self, name: str, version: str) -> bool:
        return (self.version_dir(name, version) / MANIFEST).is_file()

    def current_manifest(self, name: str) -> tuple[Path, dict] | None:
        """The folder and manifest of the current version, if there is one."""
        path = self.current(name) / MANIFEST
        return (self.current(name).resolve(), json.loads(path.read_text())) if path.is_file() else None

    @contextmanager
    def new_version(self, name: str, manifest: dict) -> Iterator[Path]:
        """Yield a temporary folder to fill; on success it becomes the current version, on any error it goes."""
        final = self.version_dir(name, manifest["version"])
        tmp = final.with_name(f".{final.name}.partial")
        try:
            self.remove_leftovers(name)  # of a sync that crashed: never visible, safe to drop
            tmp.mkdir(parents=True)
            yield tmp
            (tmp / MANIFEST).write_text(json.dumps(manifest))
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.activate(name, manifest["version"])

    def activate(self, name: str, version: str) -> None:
        """Point `current` at a complete version with one atomic rename; keep it and the one before."""
        link = self.current(name)
        tmp = link.with_name(f".current.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        os.symlink(self.version_dir(name, version).name, tmp)
        os.replace(tmp, link)
        self.prune(name, keep=2)

    def prune(self, name: str, keep: int) -> None:
        """Remove all but the newest `keep` complete versions (the current one always stays).

        A version is renamed out of sight before it is deleted, so a crash mid-delete never leaves a
        partial folder that still looks complete."""
        current = self.current(name).resolve()
        versions = sorted((p for p in self.dataset_dir(name).glob("v-*") if p.is_dir()),
                          key=lambda p: p.stat().st_mtime, reverse=True)
        for old in versions[keep:]:
            if old != current:
                doomed = old.with_name(f".{old.name}.deleting")
                os.replace(old, doomed)
                shutil.rmtree(doomed, ignore_errors=True)

    def remove_leftovers(self, name: str) -> None:
        """Delete the partial and half-deleted versions that crashed runs left behind."""
        for leftover in self.dataset_dir(name).glob(".v-*"):
            shutil.rmtree(leftover, ignore_errors=True)


@dataclass
class SyncPlan:
    """What bringing a file server to one manifest takes: nothing (it has that version), or link what the
    current version already holds and extract the rest by shard."""

    manifest: dict
    complete: bool  # the file server already holds this version whole
    reused: set[str]  # paths hard-linked from the current version
    needed: dict[str, dict[str, FileEntry]]  # shard -> the files to extract from it


def decide_sync(server: FileServer, name: str, manifest: dict) -> SyncPlan:
    """The sync's decision for `manifest`: the orchestrator's step, its dry run and the node-side fetch share it."""
    if server.is_complete(name, manifest["version"]):
        return SyncPlan(manifest, True, set(), {})
    current = server.current_manifest(name)
    old = {f["path"]: f["sha256"] for f in current[1]["files"]} if current else {}
    reused = {f["path"] for f in manifest["files"] if old.get(f["path"]) == f["sha256"]}
    needed: dict[str, dict[str, FileEntry]] = {}
    for f in manifest["files"]:
        if f["path"] not in reused:
            needed.setdefault(f["shard"], {})[f["path"]] = FileEntry(f["path"], f["size"], f["sha256"])
    return SyncPlan(manifest, False, reused, needed)


def link_unchanged(folder: Path, reused: set[str], dest: Path) -> None:
    """Hard-link (or copy) the reused files of the current version `folder` into the new version `dest`."""
    for rel in reused:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(folder / rel, dest / rel)
        except OSError:
            shutil.copyfile(folder / rel, dest / rel)


@contextmanager
def node_lock(export: Path) -> Iterator[None]:
    """One fetch at a time per export: the other ranks of a node wait here, then find the version complete."""
    export.mkdir(parents=True, exist_ok=True)
    with open(export / ".trainflow-fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def fetch(source: Path, export: Path, name: str, threads: int = 8) -> Path:
    """Bring `export`'s current version of `name` to the data set staged in the folder `source` (its manifest.json
    and shards/); the folder to read."""
    server = FileServer(export)
    with node_lock(export):
        plan = decide_sync(server, name, parse_manifest((source / MANIFEST_FILE).read_text()))
        if plan.complete:
            server.activate(name, plan.manifest["version"])
            return server.current(name)
        with server.new_version(name, plan.manifest) as dest:
            if plan.reused:
                link_unchanged(server.current_manifest(name)[0], plan.reused, dest)
            with ThreadPoolExecutor(threads) as pool:  # tarfile and hashing release the GIL while reading
                list(pool.map(lambda item: extract_members(source / shard_file(item[0]), item[1], dest),
                              plan.needed.items()))
            bad = sizes_match(dest, plan.manifest["files"])
            if bad:
                raise ValueError(f"{len(bad)} files are missing after the fetch, e.g. {bad[0]}")
    return server.current(name)


def main(argv: list[str] | None = None) -> int:
    """The node-side fetch as a command; bad input exits 2 with one line."""
    p = argparse.ArgumentParser(description="Bring a file server (NFS or local disk) to a staged data set version.")
    p.add_argument("--source", type=Path, required=True, help="the staged data set's folder: manifest.json, shards/ "
                   "(a datastore mount of datasets/<name>/)")
    p.add_argument("--export", type=Path, required=True, help="the file server's root (NFS mount or local disk)")
    p.add_argument("--dataset", required=True, help="the data set's name")
    args = p.parse_args(argv)
    if not (args.source / MANIFEST_FILE).is_file():
        print(f"{BAD_INPUT}{args.source} has no {MANIFEST_FILE}: data set {args.dataset} was never staged there "
              "(run `trainflow stage` first)", file=sys.stderr)
        return 2
    try:
        print(f"fetched {args.dataset}: {fetch(args.source, args.export, args.dataset).resolve()}", flush=True)
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        print(f"{BAD_INPUT}cannot write to {args.export}: {'it is full' if full else exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
