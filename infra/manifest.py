"""The data set's listing, manifest and shards: plain functions that the upload and sync steps share.

A data set in Blob is `datasets/<name>/manifest.json` plus `datasets/<name>/shards/<id>.tar`. The
manifest lists every file (relative path, size, SHA-256, shard) and is written last: the data set is
complete exactly when it exists. A file goes to the shard picked by a hash of its path, so changing
one file changes (and re-uploads) only its shard; a shard's id is a hash of the paths and contents it
holds, so an unchanged shard keeps its name and is never sent twice. The layout, the manifest's format and
the checked extraction live in trainer/datasets.py, which the nodes run too.
"""

import hashlib
import io
import json
import math
import os
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infra.errors import BadInput, TrainflowError
from infra.trainer import index_data
from trainer.datasets import (FORMAT, FileEntry, dataset_prefix, extract_members, manifest_blob,  # noqa: F401
                              parse_manifest, shard_blob, sizes_match)
from trainer.errors import UsageError
from trainer.layout import check_name


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hash_files(root: Path, paths: list[str], cache: dict) -> tuple[list[FileEntry], list[str], dict]:
    """Entries for `paths`, re-hashing only files whose size or mtime changed since the cached run.

    Returns the entries, the paths that were (re)hashed (new or changed files) and the new cache.
    """
    stats = {rel: os.stat(os.path.join(root, rel)) for rel in paths}
    keys = {rel: f"{st.st_size}:{st.st_mtime_ns}" for rel, st in stats.items()}
    fresh = [rel for rel in paths if cache.get(rel, [None])[0] != keys[rel]]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # hashlib hashes without the GIL
        digests = dict(zip(fresh, pool.map(lambda rel: sha256_file(root / rel), fresh)))
    new_cache = {rel: [keys[rel], digests.get(rel) or cache[rel][1]] for rel in paths}
    return [FileEntry(rel, stats[rel].st_size, new_cache[rel][1]) for rel in paths], fresh, new_cache


def relative_paths(data_dir: Path) -> list[str]:
    """Every image of the data set, relative to data_dir, as the trainer lists them."""
    index = index_data(data_dir)
    prefix = str(data_dir).rstrip("/") + "/"
    return [p.removeprefix(prefix) for p, _ in index["train"] + (index["val"] or [])]


def check_names(paths: list[str]) -> None:
    """Refuse names that cannot be staged: by the trainer's rule for a name (trainer/layout.py: valid UTF-8, no
    control character), or two that differ only in case (they would collide on a case-insensitive file system)."""
    for path in paths:
        try:
            check_name(path)
        except UsageError as exc:
            raise BadInput(str(exc)) from None
    clashes = case_clashes(paths)
    if clashes:
        a, b = clashes[0]
        raise BadInput(f"{a!r} and {b!r} differ only in letter case ({len(clashes)} such pairs); rename one of each")


def case_clashes(paths: list[str]) -> list[tuple[str, str]]:
    """Pairs of names (files or folders) equal after case folding: on a case-insensitive share one
    would overwrite the other, or two class folders would merge."""
    seen: dict[str, str] = {}
    clashes = []
    for path in sorted(paths):
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            name = "/".join(parts[:depth])
            first = seen.setdefault(name.casefold(), name)
            if first != name and (first, name) not in clashes:
                clashes.append((first, name))
    return clashes


MIN_SHARD_BYTES = 16 << 20


def shard_count(total_bytes: int, shard_bytes: int, previous: int | None, parallel: int = 1) -> int:
    """How many shards: shards of at most shard_bytes, and at least `parallel` of them while they can
    stay above 16 MB (so a mid-size data set still uploads in parallel). The previous count is kept
    while it is within 0.5x-2x of that, so that files do not move between shards as data grows."""
    target = max(1, math.ceil(total_bytes / shard_bytes), min(parallel, math.ceil(total_bytes / MIN_SHARD_BYTES)))
    if previous and 0.5 * target <= previous <= 2 * target:
        return previous
    return target


def assign_shards(entries: list[FileEntry], count: int) -> dict[str, list[FileEntry]]:
    """Group files into `count` buckets by a hash of their path; key each group by its content id."""
    buckets: dict[int, list[FileEntry]] = {}
    for entry in sorted(entries, key=lambda e: e.path):
        bucket = int.from_bytes(hashlib.sha256(entry.path.encode()).digest()[:8], "big") % count
        buckets.setdefault(bucket, []).append(entry)
    return {shard_id(files): files for files in buckets.values()}


def shard_id(files: list[FileEntry]) -> str:
    """A name that changes exactly when a path or a content in the shard changes."""
    h = hashlib.sha256()
    for entry in files:
        h.update(f"{entry.path}\0{entry.sha256}\n".encode())
    return h.hexdigest()[:32]


def build_manifest(name: str, shards: dict[str, list[FileEntry]], shard_count: int) -> dict:
    """The manifest of a data set made of `shards` (hashed into `shard_count` buckets, some maybe empty)."""
    files = sorted(({"path": e.path, "size": e.size, "sha256": e.sha256, "shard": sid}
                    for sid, group in shards.items() for e in group), key=lambda f: f["path"])
    version = hashlib.sha256("".join(f"{f['path']}\0{f['sha256']}\n" for f in files).encode()).hexdigest()[:32]
    return {"format": FORMAT, "dataset": name, "version": version, "shard_count": shard_count,
            "files": files, "bytes": sum(f["size"] for f in files)}


def write_shard(root: Path, files: list[FileEntry], dest: Path) -> int:
    """A reproducible tar of `files` (sorted, zeroed owner and times); returns its size.

    Each file is checked against its entry as it is packed: one that changed since it was hashed
    would otherwise reach the file server as a mismatch."""
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in files:
            data = (root / entry.path).read_bytes()
            if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
                raise ChangedWhileStaging(f"{root / entry.path} changed while it was being staged; run again")
            info = tarfile.TarInfo(entry.path)
            info.size, info.mode, info.mtime = entry.size, 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return dest.stat().st_size


class ChangedWhileStaging(TrainflowError):
    """A source file changed between hashing and packing (a retry re-hashes it)."""


def manifest_bytes(manifest: dict) -> bytes:
    """The manifest as stored (compact: the C encoder, fast for a million files)."""
    return json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
