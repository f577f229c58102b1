"""The data set's index, manifest and shards on the orchestrator: what the upload step and its dry run share.

A data set in Blob is `datasets/<name>/manifest.jsonl` plus `datasets/<name>/shards/<id>.tar`. The
manifest lists every file (relative path, size, SHA-256, shard) and is written last: the data set is
complete exactly when it exists. A file goes to the shard picked by a hash of its path, so changing
one file changes (and re-uploads) only its shard; a shard's id is a hash of the paths and contents it
holds, so an unchanged shard keeps its name and is never sent twice. The manifest's format, the file
server's versions and the checked extraction live in nodelib/staged/, which the nodes run too.

Nothing here holds the data set's file list in memory (ImageNet has 1.33 million files): a scan writes one
row per file to a SQLite index (`Index`), a batch at a time, taking each unchanged file's SHA-256 and image
check from the previous scan's index (same size and mtime), and the manifest and shards are read back from it.

A full disk ends each writer here in one line (infra/core/diskspace.py) with its partial file gone and the previous
complete one kept: the index replaces the cache only once whole, and a cache it cannot finish is dropped.
`staging_needs` is what staging will write where, checked before anything starts.
"""

import hashlib
import io
import itertools
import math
import os
import sqlite3
import tarfile
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.core.diskspace import Need, check_needs, existing, writing
from infra.core.errors import BadInput, TrainflowError
from nodelib.errors import UsageError
from nodelib.image_files import on_all_cores
from nodelib.layout import IMAGENET_LAYOUT, check_name, layout_files
from nodelib.scripts import sha256_file
from nodelib.staged.manifest import (  # those marked F401 are re-exported: the orchestrator's manifest names are here
    ROWS_PER_BATCH,
    Manifest,  # noqa: F401 - re-exported: the format the orchestrator's steps use
    batched,
    insert_batches,
    manifest_lines,
)
from nodelib.staged.names import (  # the format's names, re-exported (F401) for the orchestrator's steps
    FORMAT,  # noqa: F401 - re-exported: the format the orchestrator's steps use
    FileEntry,
    check_dataset_name,  # noqa: F401 - re-exported: the format the orchestrator's steps use
    dataset_prefix,  # noqa: F401 - re-exported: the format the orchestrator's steps use
    manifest_blob,  # noqa: F401 - re-exported: the format the orchestrator's steps use
    shard_blob,  # noqa: F401 - re-exported: the format the orchestrator's steps use
)
from nodelib.staged.versions import (  # re-exported (F401): the checked extraction the orchestrator's sync runs
    extract_members,  # noqa: F401 - re-exported: the format the orchestrator's steps use
    sizes_match,  # noqa: F401 - re-exported: the format the orchestrator's steps use
)

LOOKUP_BATCH = 500  # paths per cache query (SQLite's limit on variables is far above)
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INT, mtime_ns INT, sha256 TEXT, bad TEXT, "
    "folded TEXT, bucket INT) WITHOUT ROWID"
)


def relative_paths(data_dir: Path, layout: str = IMAGENET_LAYOUT) -> Iterator[str]:
    """Every file of the data set in its `layout`, relative to data_dir, as the trainer lists them (its rules, its
    errors): the ImageNet layout's images one class folder at a time, or every file (nodelib/layout.py)."""
    prefix = str(data_dir).rstrip("/") + "/"
    try:
        for path in layout_files(data_dir, layout):
            yield path.removeprefix(prefix)
    except UsageError as exc:
        raise BadInput(str(exc)) from None


def check_names(paths: Iterable[str]) -> None:
    """Refuse names that cannot be staged: by the trainer's rule for a name (nodelib/layout.py: valid UTF-8, no
    control character), or two that differ only in case (they would collide on a case-insensitive file system).
    `paths` are streamed, each folder's files together (as the listing yields them)."""

    def checked() -> Iterator[str]:
        for path in paths:
            try:
                check_name(path)
            except UsageError as exc:
                raise BadInput(str(exc)) from None
            yield path

    refuse_clashes(case_clashes(checked()))


def refuse_clashes(clashes: list[tuple[str, str]]) -> None:
    """BadInput naming the first pair of names that differ only in case, if any."""
    if clashes:
        a, b = clashes[0]
        raise BadInput(f"{a!r} and {b!r} differ only in letter case ({len(clashes)} such pairs); rename one of each")


def case_clashes(paths: Iterable[str]) -> list[tuple[str, str]]:
    """Pairs of names (files or folders) equal after case folding: on a case-insensitive share one would overwrite
    the other, or two class folders would merge. Two paths clash exactly where two names in one folder do, so it
    holds every folder's name (thousands for ImageNet) but only one folder's files at a time: `paths` must come
    each folder's files together, as the listing yields them."""
    folders: dict[str, str] = {}
    clashes: list[tuple[str, str]] = []
    parent: str | None = None
    names: dict[str, str] = {}
    for path in paths:
        folder, _, name = path.rpartition("/")
        if folder != parent:
            parent, names = folder, {}
            parts = folder.split("/")
            for depth in range(1, len(parts) + 1):
                clash(folders, "/".join(parts[:depth]), clashes)
        clash(names, path, clashes)
    return clashes


def clash(seen: dict[str, str], name: str, clashes: list[tuple[str, str]]) -> None:
    """Record `name` in `seen` (by its case folding), and a clash with the name seen before it, once."""
    first = seen.setdefault(name.casefold(), name)
    if first != name and (first, name) not in clashes:
        clashes.append((first, name))


MIN_SHARD_BYTES = 16 << 20


def shard_count(total_bytes: int, shard_bytes: int, previous: int | None, parallel: int = 1) -> int:
    """How many shards: shards of at most shard_bytes, and at least `parallel` of them while they can
    stay above 16 MB (so a mid-size data set still uploads in parallel). The previous count is kept
    while it is within 0.5x-2x of that, so that files do not move between shards as data grows."""
    target = max(1, math.ceil(total_bytes / shard_bytes), min(parallel, math.ceil(total_bytes / MIN_SHARD_BYTES)))
    if previous and 0.5 * target <= previous <= 2 * target:
        return previous
    return target


def bucket_of(path: str, count: int) -> int:
    """The bucket of a file among `count`: a hash of its path, so a file stays put while the count does."""
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big") % count


class Index:
    """One row per file of a data set folder (path, size, mtime, SHA-256, image check, bucket) in SQLite.

    `scan` fills a fresh index from the folder; files whose size and mtime match a row of `cache` (the previous
    scan's index) keep its hash and image check, the rest are read (hashed, and checked by `check`), a batch at
    a time. The manifest and the shards are read back from it sorted by path, so nothing holds every file.
    """

    def __init__(self, db: Path):
        self.path = db
        self.db = sqlite3.connect(db, check_same_thread=False, isolation_level=None, uri=True)
        self.db.executescript(f"PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; {SCHEMA};")
        self.shards: dict[int, str] = {}  # bucket -> shard id, once planned
        self.lock = threading.Lock()  # the upload's threads each read their shard's files

    def close(self) -> None:
        self.db.close()

    def scan(
        self,
        data_dir: Path,
        cache: Path | None,
        check: Callable[[list[str]], list[tuple[str, str]]],
        progress: Callable[[int], None] = lambda n: None,
        layout: str = IMAGENET_LAYOUT,
    ) -> int:
        """Index the folder (the trainer's rules for its layout); returns how many files were new or changed."""
        if cache and cache.exists():  # read only: a dry run changes nothing
            self.db.execute("ATTACH DATABASE ? AS cache", (f"file:{urllib.parse.quote(str(cache))}?mode=ro",))
        else:
            self.db.execute("ATTACH DATABASE ':memory:' AS cache")
            self.db.execute(SCHEMA.replace("files", "cache.files", 1))
        fresh, paths = 0, relative_paths(data_dir, layout)
        while batch := list(itertools.islice(paths, ROWS_PER_BATCH)):
            fresh += self.add(data_dir, batch, check)
            progress(len(batch))
        self.db.execute("DETACH DATABASE cache")
        self.refuse_case_clashes()
        return fresh

    def add(self, root: Path, paths: list[str], check) -> int:
        """Rows for a batch of paths: cached where size and mtime match, else hashed and checked now."""
        cached: dict[str, tuple[int, int, str, str | None]] = {}  # path -> size, mtime_ns, sha256, bad
        for i in range(0, len(paths), LOOKUP_BATCH):
            part = paths[i : i + LOOKUP_BATCH]
            cached.update(
                (row[0], row[1:])
                for row in self.db.execute(
                    f"SELECT path, size, mtime_ns, sha256, bad FROM cache.files WHERE path IN "
                    f"({','.join('?' * len(part))})",
                    part,
                )
            )
        rows, fresh = [], []
        for rel in paths:  # names checked by the listing (nodelib/layout.py)
            st = os.stat(os.path.join(root, rel))
            hit = cached.get(rel)
            if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
                rows.append((rel, st.st_size, st.st_mtime_ns, hit[2], hit[3]))
            else:
                fresh.append((rel, st.st_size, st.st_mtime_ns))
        if fresh:
            rows += read_fresh(root, fresh, check)
        insert_batches(
            self.db, "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, NULL)", ((*row, row[0].casefold()) for row in rows)
        )
        return len(fresh)

    def refuse_case_clashes(self) -> None:
        """Two files, or two folders, whose names differ only in case (see case_clashes)."""
        pairs = self.db.execute("SELECT min(path), max(path) FROM files GROUP BY folded HAVING count(*) > 1").fetchall()
        folders = {os.path.dirname(p) for (p,) in self.rows("SELECT path FROM files")} if not pairs else ()
        refuse_clashes(pairs or case_clashes(f"{folder}/" for folder in sorted(folders)))  # each a folder of its own

    def total(self) -> tuple[int, int]:
        """Files and bytes."""
        return self.db.execute("SELECT count(*), coalesce(sum(size), 0) FROM files").fetchone()

    def bad(self) -> list[tuple[str, str]]:
        """The files whose image check failed, with why, sorted by path."""
        return self.db.execute("SELECT path, bad FROM files WHERE bad IS NOT NULL ORDER BY path").fetchall()

    def plan_shards(self, count: int) -> str:
        """Put each file in its bucket of `count`, name each bucket's shard by its content; returns the data set's
        version (a hash of every path and content)."""
        shards: dict[int, hashlib._Hash] = {}  # a local annotation: never evaluated, _Hash is typeshed's
        version = hashlib.sha256()
        self.db.create_function("bucket_of", 2, bucket_of, deterministic=True)
        with writing(self.path, partial=self.path):  # half-updated (no journal), the cache would mislead the next run
            self.db.execute("UPDATE files SET bucket = bucket_of(path, ?)", (count,))
            self.db.execute("CREATE INDEX IF NOT EXISTS by_bucket ON files (bucket, path)")
        for path, sha, bucket in self.rows("SELECT path, sha256, bucket FROM files ORDER BY path"):
            line = f"{path}\0{sha}\n".encode()
            shards.setdefault(bucket, hashlib.sha256()).update(line)
            version.update(line)
        self.shards = {bucket: h.hexdigest()[:32] for bucket, h in shards.items()}
        return version.hexdigest()[:32]

    def rows(self, sql: str, args: tuple = ()) -> Iterator[tuple]:
        """A query's rows, a batch at a time."""
        with self.lock:
            cursor = self.db.execute(sql, args)
        yield from batched(cursor, self.lock)

    def shard_files(self, shard: str) -> Iterator[FileEntry]:
        """The files of one shard, sorted by path, a batch at a time (a shard of small files holds 100,000s)."""
        bucket = next(b for b, s in self.shards.items() if s == shard)
        rows = self.rows("SELECT path, size, sha256 FROM files WHERE bucket = ? ORDER BY path", (bucket,))
        return (FileEntry(*row) for row in rows)

    def shard_sizes(self) -> dict[str, tuple[int, int]]:
        """Each shard's files and bytes."""
        return {
            self.shards[b]: (n, size)
            for b, n, size in self.db.execute("SELECT bucket, count(*), sum(size) FROM files GROUP BY bucket")
        }

    def manifest_rows(self) -> Iterator[tuple]:
        """(path, size, sha256, shard) of every file, sorted by path: the manifest's lines."""
        shards = self.shards
        return (
            (p, s, h, shards[b])
            for p, s, h, b in self.rows("SELECT path, size, sha256, bucket FROM files ORDER BY path")
        )


def read_fresh(root: Path, fresh: list[tuple[str, int, int]], check) -> list[tuple]:
    """Rows of new or changed files: hashed on every core (hashlib releases the GIL), and image-checked."""
    digests = on_all_cores(lambda row: sha256_file(root / row[0]), fresh)
    bad = dict(check([os.path.join(root, rel) for rel, _, _ in fresh]))
    return [
        (rel, size, mtime, digest, bad.get(os.path.join(root, rel)))
        for (rel, size, mtime), digest in zip(fresh, digests)
    ]


@contextmanager
def scanned(
    data_dir: Path, cache: Path, check, keep: bool, progress=lambda n: None, layout: str = IMAGENET_LAYOUT
) -> Iterator[tuple[Index, int]]:
    """A fresh index of the folder in its `layout` and how many files were new or changed; with `keep` it becomes
    the cache of the next scan once the block succeeds (the dry run keeps nothing)."""
    if keep:
        cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".index-", dir=cache.parent if keep else None) as tmp:
        index = Index(Path(tmp) / cache.name)
        try:
            with writing(cache if keep else index.path, partial=index.path):
                fresh = index.scan(data_dir, cache, check, progress, layout)
            if keep:  # the hashes and checks are kept even if the caller then fails (on bad images, say)
                os.replace(index.path, cache)
                index.path = cache
            yield index, fresh
        finally:
            index.close()


def write_manifest(index: Index, header: dict, path: Path) -> Path:
    """The manifest file of an index whose shards are planned."""
    tmp = path.with_name(f".{path.name}.partial")
    with writing(path, partial=tmp), open(tmp, "wb") as f:
        f.writelines(manifest_lines(header, index.manifest_rows()))
    os.replace(tmp, path)
    return path


def write_shard(root: Path, files: Iterable[FileEntry], dest: Path) -> int:
    """A reproducible tar of `files` (sorted, zeroed owner and times); returns its size.

    Each file is checked against its entry as it is packed: one that changed since it was hashed
    would otherwise reach the file server as a mismatch. A full disk removes the partial tar."""
    with writing(dest, partial=dest), tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in files:
            data = (root / entry.path).read_bytes()
            if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
                raise ChangedWhileStaging(f"{root / entry.path} changed while it was being staged; run again")
            info = tarfile.TarInfo(entry.path)
            info.size, info.mode, info.mtime = entry.size, 0o644, 0
            tar.addfile(info, io.BytesIO(data))
            tar.members = []  # type: ignore[attr-defined]  # typeshed's TarFile lacks `members`, the list it keeps
            # (tarfile keeps every member added: 100,000s per shard of small files)
    return dest.stat().st_size


class ChangedWhileStaging(TrainflowError):
    """A source file changed between hashing and packing (a retry re-hashes it)."""


INDEX_ROW = 200  # bytes of the index per file, about (166 measured on the digits set)
TAR_FILE = 1024  # a tar member's header and padding, at most (PAX headers only for long or non-ASCII names)


def tar_bytes(files: int, nbytes: int) -> int:
    """The size of a shard of `files` files of `nbytes` in all, at most (the 10 kB end included)."""
    return nbytes + files * TAR_FILE + 10240


def check_shard_space(folder: Path, todo: dict[str, tuple[int, int]], concurrency: int) -> None:
    """Refuse to start packing when `folder` cannot hold the `concurrency` largest shards at once."""
    largest = sorted((tar_bytes(*counts) for counts in todo.values()), reverse=True)[:concurrency]
    check_needs([Need(folder, sum(largest), "the shards being packed")], "the shards")


def allocated(folder: Path, block: int) -> tuple[int, int, int]:
    """Files, bytes, and the bytes they take on a disk of `block`-byte blocks (folders included) under `folder`."""
    files = nbytes = taken = 0
    for top, _, names in os.walk(folder):
        taken += block
        for name in names:
            size = os.stat(os.path.join(top, name)).st_size
            files, nbytes, taken = files + 1, nbytes + size, taken + -(-size // block) * block
    return files, nbytes, taken


def staging_needs(data_dir: Path, cache: Path, tmp: Path, azurite: Path | None, current: Path | None) -> list[Need]:
    """What staging `data_dir` will write: its index in `cache`, its shards while they are packed in `tmp`,
    Azurite's copy in `azurite` (when staging starts Azurite) and the file server's copy beside `current` (when
    this machine syncs it); the copies less what a previous staging left there (unchanged files stay)."""
    block = os.statvfs(existing(current or cache)).f_frsize
    files, nbytes, taken = allocated(data_dir, block)
    shards = tar_bytes(files, nbytes)
    needs = [Need(cache, files * INDEX_ROW, "the index"), Need(tmp, shards, "the shards being packed")]
    if azurite is not None:
        needs.append(Need(azurite, shards - allocated(azurite, 1)[1], "Azurite's copy"))
    if current is not None:
        kept = allocated(current.resolve(), block)[2] if current.exists() else 0
        needs.append(Need(current.parent, taken - kept, "the file server's copy"))
    return needs
