"""The file server's versions of a data set: the sync's decision, the checked extraction, the atomic switch.

A version is filled under a temporary name (every file extracted from its shard, checked against the manifest, and
created new inside the folder: no tar member but a regular file, no link followed), renamed whole, then `current`
is switched to it with one rename; the version before stays for readers still using it."""

import hashlib
import json
import os
import shutil
import tarfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from nodelib.errors import UntrustedInput, check_free, writing
from nodelib.staged.manifest import Manifest, insert_batches
from nodelib.staged.names import MANIFEST, MANIFEST_FILE, FileEntry
from nodelib.staged.rules import RESTAGE
from nodelib.verified import write_verified

FILESERVER_FIX = "free space there, or export the file server from a bigger disk (fileserver_export, or --workdir)"


def extract_members(
    tar_path: Path, wanted: Iterable[FileEntry], dest: Path, blob: str | None = None
) -> tuple[int, int]:
    """Extract the `wanted` members into dest, checking each one's size and SHA-256; returns bytes and files written.
    A member that is not a regular file is UntrustedInput naming the shard's `blob` (its name in the container).

    A shard holds its files sorted by path (write_shard) and `wanted` comes sorted by path too, so the two are
    walked together and nothing is held but a chunk of one file: a shard of small files holds 100,000s of them, a
    member may be larger than memory. A member whose size or SHA-256 is not its row's is UntrustedInput too (another
    attempt would read the same bytes), and what was written of it is removed."""
    written, files, wanted = 0, 0, iter(wanted)
    entry = next(wanted, None)
    with tarfile.open(tar_path, "r") as tar:
        for member in tar:
            # tarfile keeps every member read unless told not to
            tar.members = []  # type: ignore[attr-defined]  # typeshed's TarFile lacks `members`, the list it keeps
            if entry is None or member.name > entry.path:
                break
            if not member.isfile():  # a link, a device, a FIFO or a folder: staging writes regular files only
                blob = blob or tar_path.name
                problem = f"shard {blob} holds {member.name!r}, which is not a regular file"
                raise UntrustedInput(f"{problem}; {RESTAGE.format(blob=blob)}")
            if member.name < entry.path:
                continue  # a file the version links from the current one
            blob = blob or tar_path.name
            if member.size != entry.size:
                raise UntrustedInput(
                    f"shard {blob} holds {member.name!r} of {member.size} bytes, but the manifest says "
                    f"{entry.size}; {RESTAGE.format(blob=both(blob))}"
                )
            stream = tar.extractfile(member)
            assert stream is not None  # extractfile gives None only for what is not a regular file, refused above
            if write_member(dest, entry.path, stream) != entry.sha256:
                (dest / entry.path).unlink()
                raise UntrustedInput(
                    f"shard {blob} holds {member.name!r} with another SHA-256 than the manifest's; "
                    f"{RESTAGE.format(blob=both(blob))}"
                )
            written, files, entry = written + member.size, files + 1, next(wanted, None)
    if entry is not None:
        blob = blob or tar_path.name
        raise UntrustedInput(
            f"shard {blob} lacks files of the manifest, e.g. {entry.path}; {RESTAGE.format(blob=both(blob))}"
        )
    return written, files


def both(shard_blob: str) -> str:
    """The blobs to delete where a shard and the manifest disagree: either may be the one changed, and a re-stage
    keeps a shard whose name it finds (datasets/<name>/shards/<id>.tar beside datasets/<name>/manifest.jsonl)."""
    if "/shards/" not in shard_blob:
        return shard_blob
    return f"{shard_blob.split('/shards/')[0]}/{MANIFEST_FILE} and {shard_blob}"


def write_member(dest: Path, path: str, data: IO[bytes]) -> str:
    """One extracted file at `path` (checked by path_problem) in the version folder `dest`, created new and
    read-only: versions share files by hard link, nobody may edit one in place. Its folder must resolve inside
    `dest` and the file must not exist (no link is followed), whatever the folder already holds. `data` is read a
    megabyte at a time; its SHA-256."""
    target = dest / path
    target.parent.mkdir(parents=True, exist_ok=True)
    folder, root = os.path.realpath(target.parent), os.path.realpath(dest)  # a file at the top is in the root itself
    if folder != root and not folder.startswith(os.path.join(root, "")):
        raise UntrustedInput(
            f"{path!r} resolves outside the version folder {dest}: a link was put in it while it was written; "
            f"find what else writes to {dest.parent}"
        )
    digest = hashlib.sha256()
    with open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444), "wb") as f:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
            f.write(chunk)
    return digest.hexdigest()


def sizes_match(root: Path, rows: Iterable) -> list[str]:
    """Paths of (path, size, ...) rows that are missing under root or differ in size (a cheap completeness check)."""
    bad = []
    for path, size, *_ in rows:
        try:
            if os.stat(os.path.join(root, path)).st_size != size:
                bad.append(path)
        except FileNotFoundError:
            bad.append(path)
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

    def current_manifest(self, name: str) -> Path | None:
        """The manifest file of the current version, if there is one (of this format)."""
        path = self.current(name) / MANIFEST
        return path if path.is_file() else None

    @contextmanager
    def new_version(self, name: str, manifest: "Manifest") -> Iterator[Path]:
        """Yield a temporary folder to fill; on success it becomes the current version, on any error it goes."""
        final = self.version_dir(name, manifest.version)
        tmp = final.with_name(f".{final.name}.partial")
        try:
            self.remove_leftovers(name)  # of a sync that crashed: never visible, safe to drop
            tmp.mkdir(parents=True)
            yield tmp
            verify_version(tmp, manifest.header)
            manifest.write(tmp / MANIFEST)
            if final.exists():  # the same version in an older layout (another manifest format): replaced
                os.replace(final, final.with_name(f".{final.name}.deleting"))
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.activate(name, manifest.version)
        self.remove_leftovers(name)

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
        versions = sorted(
            (p for p in self.dataset_dir(name).glob("v-*") if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True
        )
        for old in versions[keep:]:
            if old != current:
                doomed = old.with_name(f".{old.name}.deleting")
                os.replace(old, doomed)
                shutil.rmtree(doomed, ignore_errors=True)

    def remove_leftovers(self, name: str) -> None:
        """Delete the partial and half-deleted versions that crashed runs left behind."""
        for leftover in self.dataset_dir(name).glob(".v-*"):
            shutil.rmtree(leftover, ignore_errors=True)


def verify_version(folder: Path, header: dict) -> None:
    """The version's image check as the trainer reads it (`.verified.json`: which files staging found bad), when
    staging checked the images; the trainer then decodes none of them again."""
    verified = header.get("verified")
    if verified:
        write_verified(
            folder, header["version"], header["files"], [tuple(b) for b in verified["bad"]], verified["check"]
        )


@dataclass
class SyncPlan:
    """What bringing a file server to one manifest takes: nothing (it has that version), or link what the
    current version already holds and extract the rest by shard."""

    manifest: Manifest
    complete: bool  # the file server already holds this version whole
    reused: int  # files hard-linked from the current version
    needed: dict[str, int]  # shard -> how many of its files to extract
    current: Path | None = None  # the current version's folder, where reused files come from

    def wanted(self, shard: str) -> Iterator[FileEntry]:
        """The files to extract from one shard, sorted by path, a batch at a time."""
        return (
            FileEntry(*row)
            for row in self.manifest.rows(
                "SELECT path, size, sha256 FROM files WHERE shard = ? AND path NOT IN (SELECT path FROM reuse) "
                "ORDER BY path",
                (shard,),
            )
        )

    def reused_paths(self) -> Iterator[str]:
        return (row[0] for row in self.manifest.rows("SELECT path FROM reuse"))

    def reused_bytes(self) -> int:
        return self.manifest.query("SELECT coalesce(sum(size), 0) FROM files WHERE path IN (SELECT path FROM reuse)")[
            0
        ][0]

    def needed_bytes(self) -> int:
        return self.manifest.header["bytes"] - self.reused_bytes()

    def disk_bytes(self, block: int) -> int:
        """What the files to extract take on a disk of `block`-byte blocks (each file rounds up to whole blocks)."""
        return self.manifest.query(
            "SELECT coalesce(sum((size + ? - 1) / ? * ?), 0) FROM files WHERE path NOT IN (SELECT path FROM reuse)",
            (block, block, block),
        )[0][0]


def decide_sync(server: FileServer, name: str, manifest: Manifest) -> SyncPlan:
    """The sync's decision for `manifest`: the orchestrator's step, its dry run and the node-side fetch share it.
    Files whose path and SHA-256 the current version holds are reused; the comparison runs in the manifest's
    database, a batch of the current version's rows at a time."""
    if server.is_complete(name, manifest.version):
        return SyncPlan(manifest, True, 0, {})
    with writing(manifest.path):
        return compare_versions(server, name, manifest)


def compare_versions(server: FileServer, name: str, manifest: Manifest) -> SyncPlan:
    """decide_sync's comparison with the current version, in the manifest's database."""
    db = manifest.db
    with manifest.lock:
        db.executescript(
            "DROP TABLE IF EXISTS old; DROP TABLE IF EXISTS reuse;"
            "CREATE TABLE old (path TEXT PRIMARY KEY, sha256 TEXT) WITHOUT ROWID;"
            "CREATE TABLE reuse (path TEXT PRIMARY KEY) WITHOUT ROWID;"
        )
    current = server.current_manifest(name)
    if current:
        with open(current, "rb") as f:
            next(f, None)  # the header
            rows = (json.loads(line) for line in f if line.strip())
            with manifest.lock:
                insert_batches(db, "INSERT INTO old VALUES (?, ?)", ((r[0], r[2]) for r in rows))
        manifest.query(
            "INSERT INTO reuse SELECT f.path FROM files f JOIN old o ON o.path = f.path AND o.sha256 = f.sha256"
        )
    reused = manifest.query("SELECT count(*) FROM reuse")[0][0]
    needed = dict(
        manifest.query(
            "SELECT shard, count(*) FROM files WHERE path NOT IN (SELECT path FROM reuse) GROUP BY shard ORDER BY shard"
        )
    )
    return SyncPlan(manifest, False, reused, needed, current.parent.resolve() if current else None)


def link_unchanged(plan: SyncPlan, dest: Path) -> None:
    """Hard-link (or copy) the reused files of the current version into the new version `dest`."""
    current = plan.current
    if current is None:  # compare_versions reuses files only from a current version
        raise ValueError("a plan that reuses files names no current version to link them from")
    made = set()
    for rel in plan.reused_paths():
        parent = os.path.dirname(rel)
        if parent not in made:
            os.makedirs(dest / parent, exist_ok=True)
            made.add(parent)
        try:
            os.link(current / rel, dest / rel)
        except OSError:
            shutil.copyfile(current / rel, dest / rel)


def fill_version(plan: SyncPlan, dest: Path, extract: Callable[[str, Iterator[FileEntry]], None], threads: int) -> None:
    """Fill `dest` with the plan's version: reused files linked, each needed shard's files extracted by
    `extract(shard, wanted)`, `threads` shards at a time; then check that every file is there. A disk with less
    free than the files will take is refused before the first is written."""
    check_free(dest.parent, plan.disk_bytes(os.statvfs(dest).f_frsize), FILESERVER_FIX)  # names the data set's folder
    if plan.reused:
        link_unchanged(plan, dest)
    with ThreadPoolExecutor(threads) as pool:  # tarfile and hashing release the GIL while reading
        list(pool.map(lambda shard: extract(shard, plan.wanted(shard)), plan.needed))
    bad = sizes_match(dest, plan.manifest.rows())
    if bad:
        raise ValueError(f"{len(bad)} files are missing after the sync, e.g. {bad[0]}")
