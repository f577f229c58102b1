"""A staged data set and the file server's versions of it: what the sync writes and the nodes read.

Staged (in Blob, or a datastore folder that mounts it): `datasets/<name>/manifest.jsonl` plus
`datasets/<name>/shards/<id>.tar`. The manifest lists every file (path, size, SHA-256, shard) and is
written last. On a file server (the NFS share, or a node's local disk):

    <export>/datasets/<name>/v-<version>/   one complete copy (train/, val/, .manifest.jsonl, .verified.json)
    <export>/datasets/<name>/current        symlink to the newest complete version: what training reads

The orchestrator's sync (tasks/sync_file_server.py) and the node-side fetch below share this module,
so both write the same layout the same way. Run on a node, it needs only the standard library:

    python trainer/datasets.py --source <datastore mount of datasets/imagenet/> --export /mnt/fileserver \
        --dataset imagenet

brings `<export>/datasets/imagenet/current` to the staged version: unchanged files are hard-linked from
the current version, the rest extracted from their shards and checked against the manifest; a lock in
the export makes the ranks of one node wait for the first one's fetch instead of repeating it.

What comes back from storage is input: anyone who can write the container (a leaked SAS, a shared account, a data
set someone else staged) controls the manifest and the shards. Every manifest row is checked before anything is
written (`row_problem`: a relative, normalised path under train/ or val/, a size, a SHA-256, a shard id), every
tar member must be a regular file, and every file is created new inside the version folder; a violation is
`UntrustedInput` (one line, never retried) and the half-written version is removed. The rules follow Python's
tarfile data filter (PEP 706), which refuses absolute paths, `..`, links and devices.
"""

import argparse
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import sqlite3
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script on a node: `trainer` importable, its scripts version checked
    sys.pycache_prefix = sys.pycache_prefix or os.path.expanduser("~/.cache/trainflow/pycache")  # never a share's
    sys.path.insert(0, scripts := str(Path(__file__).resolve().parents[1]))
    from trainer.scripts import exit_unless_intact

    exit_unless_intact(Path(scripts))  # before any other module of the package is imported

from trainer.errors import DiskFull, UntrustedInput, UsageError, check_free, writing
from trainer.layout import check_name, write_verified

FORMAT = 2
MANIFEST = ".manifest.jsonl"  # a complete version's copy of its manifest, on the file server
MANIFEST_FILE = "manifest.jsonl"  # the staged manifest, in the data set's folder
BAD_INPUT = "error: "  # how this command's bad-input lines begin
ROWS_PER_BATCH = 10_000  # rows moved between the manifest file and its index at a time
FILESERVER_FIX = "free space there, or export the file server from a bigger disk (fileserver_export, or --workdir)"
SPLITS = ("train", "val")  # the folders a staged path starts with (trainer/layout.py's layout)
HEX_ID = re.compile(r"[0-9a-f]{16,64}")  # a version or shard id: a hash of what it holds (infra/data/manifest.py)
SHA256 = re.compile(r"[0-9a-f]{64}")
DRIVE = re.compile(r"[A-Za-z]:")  # C: - a Windows drive, which no staged path starts with
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # one folder and blob-name component, never . or ..
RESTAGE = (  # the fix for a staged blob that breaks the format: without it a re-stage would keep it
    "nothing of it was kept; delete {blob} from the container, stage the data set again from its folder (`trainflow "
    "stage --data FOLDER`), and check who can write to the container"
)


@dataclass(frozen=True, slots=True)
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


class Manifest:
    """A data set's manifest, held in a SQLite file rather than in memory (ImageNet has 1.33 million files).

    Stored (in Blob, on the file server) as JSON lines: the header, a JSON object (format, dataset, version,
    shard_count, files, bytes, and `verified` when staging checked the images), then one JSON array per file,
    sorted by path: [path, size, sha256, shard]. Written and read a batch of rows at a time, so that neither end
    holds the whole list. `SyncPlan` adds the file server's current version to the same database.
    """

    def __init__(self, db: Path | str, header: dict | None = None):
        self.path = Path(db)  # where a full disk is met (":memory:" holds it in memory)
        self.db = sqlite3.connect(db, check_same_thread=False, isolation_level=None)
        self.db.executescript(
            "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA temp_store=FILE;"
            "CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INT, sha256 TEXT, "
            "shard TEXT) WITHOUT ROWID; CREATE INDEX IF NOT EXISTS by_shard ON files (shard);"
        )
        self.header = header or {}
        self.lock = threading.Lock()  # one query at a time: the sync's threads ask for their shards

    @classmethod
    def read(cls, lines: Iterable[bytes | str], db: Path | str, name: str | None = None) -> "Manifest":
        """A manifest from its stored lines (a file or a blob's lines), every line checked (`row_problem`) as it is
        indexed: UntrustedInput naming the data set (`name`, else the header's), the line and what is wrong."""
        lines = iter(lines)
        header = parsed(next(lines, b"{}") or b"{}", name, 1)
        name = name or str(header.get("dataset"))
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else None
            raise ValueError(f"manifest format {found} is not {FORMAT}")
        if problem := header_problem(header, name):
            raise untrusted(name, 1, problem)
        manifest = cls(db, header)
        try:
            with writing(manifest.path):
                manifest.insert(checked_rows(lines, name))
        except sqlite3.IntegrityError:  # the primary key: one path on two rows
            manifest.close()
            raise untrusted(name, None, "lists one path on two rows") from None
        except BaseException:
            manifest.close()
            raise
        return manifest

    @classmethod
    def load(cls, path: Path, db: Path | str, name: str | None = None) -> "Manifest":
        """A manifest from a file (see read)."""
        with open(path, "rb") as f:
            return cls.read(f, db, name)

    def insert(self, rows: Iterable) -> None:
        """Add (path, size, sha256, shard) rows, a batch at a time."""
        with self.lock:
            insert_batches(self.db, "INSERT INTO files VALUES (?, ?, ?, ?)", rows)

    def query(self, sql: str, args: tuple = ()) -> list:
        """All rows of a query that returns few (counts, one shard's files)."""
        with self.lock:
            return self.db.execute(sql, args).fetchall()

    def rows(
        self, sql: str = "SELECT path, size, sha256, shard FROM files ORDER BY path", args: tuple = ()
    ) -> Iterator:
        """The rows of a query, a batch at a time (by default every file, sorted by path)."""
        with self.lock:
            cursor = self.db.execute(sql, args)
        yield from batched(cursor, self.lock)

    def __len__(self) -> int:
        return self.query("SELECT count(*) FROM files")[0][0]

    @property
    def version(self) -> str:
        return self.header["version"]

    def shards(self) -> set[str]:
        """The shards that hold the files."""
        return {row[0] for row in self.query("SELECT DISTINCT shard FROM files")}

    def shard_files(self, shard: str) -> dict[str, FileEntry]:
        """One shard's files, by path."""
        return {
            p: FileEntry(p, s, h)
            for p, s, h in self.query("SELECT path, size, sha256 FROM files WHERE shard = ? ORDER BY path", (shard,))
        }

    def write(self, path: Path) -> Path:
        """Write the manifest to a file, whole or not at all."""
        tmp = path.with_name(f".{path.name}.partial")
        with writing(path, partial=tmp), open(tmp, "wb") as f:
            f.writelines(manifest_lines(self.header, self.rows()))
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Manifest":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def untrusted(name: str, line: int | None, problem: str) -> UntrustedInput:
    """The one line for a staged data set whose manifest or shards break the format's rules."""
    where = f"line {line} of its {MANIFEST_FILE}" if line else f"its {MANIFEST_FILE}"
    fix = RESTAGE.format(blob=manifest_blob(name))
    return UntrustedInput(f"staged data set {name!r} cannot be used: {where} {problem}; {fix}")


def parsed(line: bytes | str, name: str | None, number: int):
    """One manifest line's JSON, or UntrustedInput naming the line."""
    try:
        return json.loads(line)
    except ValueError:
        raise untrusted(name or "?", number, "is not JSON") from None


def checked_rows(lines: Iterable[bytes | str], name: str) -> Iterator[list]:
    """The manifest's file rows (after its header), each checked by `row_problem`; lines are numbered from 2."""
    for number, line in enumerate(lines, start=2):
        if line.strip():
            row = parsed(line, name, number)
            if problem := row_problem(row):
                raise untrusted(name, number, problem)
            yield row


def header_problem(header: dict, name: str) -> str | None:
    """What is wrong with a manifest's header, or None: its data set, version id and counts as staging writes them."""
    if header.get("dataset") != name:
        return f"names data set {header.get('dataset')!r}, not {name!r}"
    if not (isinstance(header.get("version"), str) and HEX_ID.fullmatch(header["version"])):
        return f"has version {header.get('version')!r}, not a hexadecimal id"
    if any(not is_count(header.get(key)) for key in ("shard_count", "files", "bytes")):
        return "lacks a count (shard_count, files, bytes)"
    verified = header.get("verified") or {}
    bad = verified.get("bad", []) if isinstance(verified, dict) else None
    if not isinstance(bad, list) or any(not is_bad_file(entry) for entry in bad):
        return "lists a bad file that is not a [path, reason] of the data set"
    return None


def is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def is_bad_file(entry: object) -> bool:
    """A `verified.bad` entry: [path, reason] with a path that passes path_problem."""
    return isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str) and not path_problem(entry[0])


def row_problem(row: object) -> str | None:
    """What makes a manifest row unusable, or None: [path, size, sha256, shard], each as staging writes it."""
    if not (isinstance(row, list) and len(row) == 4):
        return "is not a [path, size, sha256, shard] row"
    path, size, sha256, shard = row
    if problem := path_problem(path):
        return f"names {path!r}, which {problem}"
    if not is_count(size):
        return f"gives {path!r} the size {size!r}, not a byte count"
    if not (isinstance(sha256, str) and SHA256.fullmatch(sha256)):
        return f"gives {path!r} the digest {sha256!r}, not a SHA-256"
    if not (isinstance(shard, str) and HEX_ID.fullmatch(shard)):
        return f"puts {path!r} in shard {shard!r}, not a hexadecimal id"
    return None


def path_problem(path: object) -> str | None:
    """What keeps a staged path from being written inside a version folder, or None. A path is relative,
    "/"-separated and normalised, free of NUL, backslashes and drive letters, and names a visible file under
    train/<class>/ or val/<class>/, as staging lists them (trainer/layout.py)."""
    if not isinstance(path, str) or not path:
        return "is not a file name"
    if "\0" in path or "\\" in path or DRIVE.match(path):
        return "holds a NUL byte, a backslash or a drive letter"
    if path.startswith("/"):
        return "is an absolute path"
    parts = path.split("/")
    if ".." in parts:
        return "climbs out of the data set (..)"
    if any(part in ("", ".") for part in parts):
        return "is not a normalised path (an empty or . component)"
    if any(part.startswith(".") for part in parts):
        return "names a hidden file or folder, which staging never stages"
    if parts[0] not in SPLITS or len(parts) < 3:
        return "is not under train/<class>/ or val/<class>/"
    try:
        check_name(path)
    except UsageError:
        return "holds a control character or is not valid UTF-8"
    return None


def check_dataset_name(name: str) -> str:
    """A data set's name, or UsageError: one folder and blob-name component ([A-Za-z0-9._-], starting with a letter or
    digit), so that it never leaves datasets/."""
    if not DATASET_NAME.fullmatch(name):
        raise UsageError(
            f"data set name {name!r} is not a name: use letters, digits, '.', '_' and '-' (up to 100, starting with a "
            "letter or digit)"
        )
    return name


def insert_batches(db: sqlite3.Connection, sql: str, rows: Iterable) -> None:
    """Run an INSERT for each row, one transaction per batch of rows (the rows are not all held at once)."""
    rows = iter(rows)
    while batch := list(itertools.islice(rows, ROWS_PER_BATCH)):
        db.execute("BEGIN")
        db.executemany(sql, batch)
        db.execute("COMMIT")


def batched(cursor: sqlite3.Cursor, lock: threading.Lock) -> Iterator:
    """A query's rows, fetched a batch at a time (under `lock`: the connection is shared by threads)."""
    while True:
        with lock:
            batch = cursor.fetchmany(ROWS_PER_BATCH)
        if not batch:
            return
        yield from batch


def manifest_lines(header: dict, rows: Iterable[tuple]) -> Iterator[bytes]:
    """A manifest as stored: the header, then one line per (path, size, sha256, shard) row."""
    yield json.dumps(header, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    for row in rows:
        yield dumps(row).encode() + b"\n"


def extract_members(
    tar_path: Path, wanted: Iterable[FileEntry], dest: Path, blob: str | None = None
) -> tuple[int, int]:
    """Extract the `wanted` members into dest, checking each one's size and SHA-256; returns bytes and files written.
    A member that is not a regular file is UntrustedInput naming the shard's `blob` (its name in the container).

    A shard holds its files sorted by path (write_shard) and `wanted` comes sorted by path too, so the two are
    walked together and nothing is held but one file: a shard of small files holds 100,000s of them."""
    written, files, wanted = 0, 0, iter(wanted)
    entry = next(wanted, None)
    with tarfile.open(tar_path, "r") as tar:
        for member in tar:
            tar.members = []  # tarfile keeps every member read unless told not to
            if entry is None or member.name > entry.path:
                break
            if not member.isfile():  # a link, a device, a FIFO or a folder: staging writes regular files only
                blob = blob or tar_path.name
                problem = f"shard {blob} holds {member.name!r}, which is not a regular file"
                raise UntrustedInput(f"{problem}; {RESTAGE.format(blob=blob)}")
            if member.name < entry.path:
                continue  # a file the version links from the current one
            data = tar.extractfile(member).read()
            if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
                raise ValueError(f"{member.name} in {tar_path.name} does not match the manifest")
            write_member(dest, entry.path, data)
            written, files, entry = written + len(data), files + 1, next(wanted, None)
    if entry is not None:
        raise ValueError(f"{tar_path.name} lacks files of the manifest, e.g. {entry.path}")
    return written, files


def write_member(dest: Path, path: str, data: bytes) -> None:
    """One extracted file at `path` (checked by path_problem) in the version folder `dest`, created new and
    read-only: versions share files by hard link, nobody may edit one in place. Its folder must resolve inside
    `dest` and the file must not exist (no link is followed), whatever the folder already holds."""
    target = dest / path
    target.parent.mkdir(parents=True, exist_ok=True)
    if not os.path.realpath(target.parent).startswith(os.path.join(os.path.realpath(dest), "")):
        raise UntrustedInput(
            f"{path!r} resolves outside the version folder {dest}: a link was put in it while it was written; "
            f"find what else writes to {dest.parent}"
        )
    with open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444), "wb") as f:
        f.write(data)


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
    made = set()
    for rel in plan.reused_paths():
        parent = os.path.dirname(rel)
        if parent not in made:
            os.makedirs(dest / parent, exist_ok=True)
            made.add(parent)
        try:
            os.link(plan.current / rel, dest / rel)
        except OSError:
            shutil.copyfile(plan.current / rel, dest / rel)


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


@contextmanager
def node_lock(export: Path) -> Iterator[None]:
    """One fetch at a time per export: the other ranks of a node wait here, then find the version complete."""
    export.mkdir(parents=True, exist_ok=True)
    with open(export / ".trainflow-fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def fetch(source: Path, export: Path, name: str, threads: int = 8) -> Path:
    """Bring `export`'s current version of `name` to the data set staged in the folder `source` (its manifest and
    shards/); the folder to read."""
    server = FileServer(export)
    with (
        node_lock(export),
        tempfile.TemporaryDirectory(prefix=".trainflow-", dir=export) as tmp,
        Manifest.load(source / MANIFEST_FILE, Path(tmp) / "manifest.db", name) as manifest,
    ):
        plan = decide_sync(server, name, manifest)
        if plan.complete:
            server.activate(name, manifest.version)
            return server.current(name)
        with server.new_version(name, manifest) as dest:

            def extract(shard: str, wanted: Iterator[FileEntry]) -> None:
                extract_members(source / shard_file(shard), wanted, dest, shard_blob(name, shard))

            fill_version(plan, dest, extract, threads)
    return server.current(name)


def main(argv: list[str] | None = None) -> int:
    """The node-side fetch as a command; bad input exits 2 with one line."""
    p = argparse.ArgumentParser(description="Bring a file server (NFS or local disk) to a staged data set version.")
    p.add_argument(
        "--source",
        type=Path,
        required=True,
        help="the staged data set's folder: manifest.jsonl, shards/ (a datastore mount of datasets/<name>/)",
    )
    p.add_argument("--export", type=Path, required=True, help="the file server's root (NFS mount or local disk)")
    p.add_argument("--dataset", required=True, help="the data set's name")
    args = p.parse_args(argv)
    try:
        check_dataset_name(args.dataset)
    except UsageError as exc:
        print(f"{BAD_INPUT}{exc}", file=sys.stderr)
        return 2
    if not (args.source / MANIFEST_FILE).is_file():
        print(
            f"{BAD_INPUT}{args.source} has no {MANIFEST_FILE}: data set {args.dataset} was never staged there "
            "(run `trainflow stage` first)",
            file=sys.stderr,
        )
        return 2
    try:
        with writing(args.export, fix=FILESERVER_FIX):
            print(f"fetched {args.dataset}: {fetch(args.source, args.export, args.dataset).resolve()}", flush=True)
    except UntrustedInput as exc:
        print(f"{BAD_INPUT}{exc}", file=sys.stderr)
        return 2
    except DiskFull as exc:
        print(f"{BAD_INPUT}{exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{BAD_INPUT}cannot write to {args.export}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
