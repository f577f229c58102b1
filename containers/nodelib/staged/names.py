"""The names of a staged data set's parts: its blobs, its files on a file server, the data set's own name."""

import re
from dataclasses import dataclass

from nodelib.errors import UsageError

FORMAT = 2
MANIFEST = ".manifest.jsonl"  # a complete version's copy of its manifest, on the file server
MANIFEST_FILE = "manifest.jsonl"  # the staged manifest, in the data set's folder
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # one folder and blob-name component, never . or ..


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


def check_dataset_name(name: str) -> str:
    """A data set's name, or UsageError: one folder and blob-name component ([A-Za-z0-9._-], starting with a letter or
    digit), so that it never leaves datasets/."""
    if not DATASET_NAME.fullmatch(name):
        raise UsageError(
            f"data set name {name!r} is not a name: use letters, digits, '.', '_' and '-' (up to 100, starting with a "
            "letter or digit)"
        )
    return name
