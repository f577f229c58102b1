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
"""

import argparse
import fcntl
import hashlib
import itertools
import json
import os
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

if __package__ in (None, ""):  # run as a script on a node: make the `trainer` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.errors import DiskFull, check_free, writing
from trainer.layout import write_verified

FORMAT = 2
MANIFEST = ".manifest.jsonl"  # a complete version's copy of its manifest, on the file server
MANIFEST_FILE = "manifest.jsonl"  # the staged manifest, in the data set's folder
BAD_INPUT = "error: "  # how this command's bad-input lines begin
ROWS_PER_BATCH = 10_000  # rows moved between the manifest file and its index at a time
FILESERVER_FIX = "free space there, or export the file server from a bigger disk (fileserver_export, or --workdir)"


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
    def read(cls, lines: Iterable[bytes | str], db: Path | str) -> "Manifest":
        """A manifest from its stored lines (a file or a blob's lines), checked for its format."""
        lines = iter(lines)
        header = json.loads(next(lines, b"{}") or b"{}")
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else None
            raise ValueError(f"manifest format {found} is not {FORMAT}")
        manifest = cls(db, header)
        with writing(manifest.path):
            manifest.insert(json.loads(line) for line in lines if line.strip())
        return manifest

    @classmethod
    def load(cls, path: Path, db: Path | str) -> "Manifest":
        """A manifest from a file."""
        with open(path, "rb") as f:
            return cls.read(f, db)

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


def extract_members(tar_path: Path, wanted: Iterable[FileEntry], dest: Path) -> tuple[int, int]:
    """Extract the `wanted` members into dest, checking each one's size and SHA-256; returns bytes and files written.

    A shard holds its files sorted by path (write_shard) and `wanted` comes sorted by path too, so the two are
    walked together and nothing is held but one file: a shard of small files holds 100,000s of them."""
    written, files, wanted = 0, 0, iter(wanted)
    entry = next(wanted, None)
    with tarfile.open(tar_path, "r") as tar:
        for member in tar:
            tar.members = []  # tarfile keeps every member read unless told not to
            if entry is None or member.name > entry.path:
                break
            if member.name < entry.path or not member.isfile():
                continue  # a file the version links from the current one (or not a file: found missing below)
            data = tar.extractfile(member).read()
            if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
                raise ValueError(f"{member.name} in {tar_path.name} does not match the manifest")
            write_member(dest / entry.path, data)
            written, files, entry = written + len(data), files + 1, next(wanted, None)
    if entry is not None:
        raise ValueError(f"{tar_path.name} lacks files of the manifest, e.g. {entry.path}")
    return written, files


def write_member(target: Path, data: bytes) -> None:
    """One extracted file, read-only: versions share files by hard link, nobody may edit one in place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as f:
        f.write(data)
    target.chmod(0o444)


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
        Manifest.load(source / MANIFEST_FILE, Path(tmp) / "manifest.db") as manifest,
    ):
        plan = decide_sync(server, name, manifest)
        if plan.complete:
            server.activate(name, manifest.version)
            return server.current(name)
        with server.new_version(name, manifest) as dest:
            fill_version(
                plan, dest, lambda shard, wanted: extract_members(source / shard_file(shard), wanted, dest), threads
            )
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
    except DiskFull as exc:
        print(f"{BAD_INPUT}{exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{BAD_INPUT}cannot write to {args.export}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
