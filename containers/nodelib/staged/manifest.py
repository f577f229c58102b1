"""A data set's manifest, held in SQLite a batch of rows at a time, every line checked as it is read (rules.py)."""

import itertools
import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from nodelib.errors import writing
from nodelib.staged.names import FORMAT, FileEntry
from nodelib.staged.rules import checked_rows, header_layout, header_problem, parsed, untrusted

ROWS_PER_BATCH = 10_000  # rows moved between the manifest file and its index at a time


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
                manifest.insert(checked_rows(lines, name, str(header_layout(header))))
        except sqlite3.IntegrityError:  # the primary key: one path on two rows
            manifest.close()
            raise untrusted(name, None, "lists one path on two rows") from None
        except BaseException:
            manifest.close()
            raise
        if clash := manifest.file_and_folder():
            manifest.close()
            raise untrusted(name, None, f"lists {clash!r} both as a file and as a folder of other files")
        return manifest

    def file_and_folder(self) -> str | None:
        """A path that another row's path has as a folder (a/b and a/b/c), which no folder on disk can hold; None."""
        # the paths under a/b/ sort from "a/b/" up to "a/b0" ("/" is 0x2F, "0" 0x30): one index range per row
        found = self.query(
            "SELECT a.path FROM files a WHERE EXISTS (SELECT 1 FROM files b WHERE b.path >= a.path || '/' "
            "AND b.path < a.path || '0') LIMIT 1"
        )
        return found[0][0] if found else None

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
