"""What a staged manifest may say: every row and the header checked before anything is written.

The rules are those of staging's own output (infra/data/manifest.py writes it): a path is relative, "/"-separated,
normalised and, in the ImageNet layout (the header's `layout`: none, or "files" for a user's script), under
train/<class>/ or val/<class>/, as nodelib/layout.py lists a data folder; a size is a count; a
digest a SHA-256; a version or shard id a hexadecimal hash. Python's tarfile data filter (PEP 706) refuses the same
absolute paths, `..` and drive letters."""

import json
import re
from collections.abc import Iterable, Iterator

from nodelib.errors import UntrustedInput, UsageError
from nodelib.layout import IMAGENET_LAYOUT, LAYOUTS, check_name
from nodelib.staged.names import MANIFEST_FILE, manifest_blob

SPLITS = ("train", "val")  # the folders a staged path starts with (nodelib/layout.py's layout)
HEX_ID = re.compile(r"[0-9a-f]{16,64}")  # a version or shard id: a hash of what it holds (infra/data/manifest.py)
SHA256 = re.compile(r"[0-9a-f]{64}")
NAME_MAX = 255  # the bytes of one file or folder name that Linux's file systems take (ext4, xfs, NFS: NAME_MAX)
DRIVE = re.compile(r"[A-Za-z]:")  # C: - a Windows drive, which no staged path starts with
RESTAGE = (  # the fix for a staged blob that breaks the format: without it a re-stage would keep it
    "nothing of it was kept; delete {blob} from the container, stage the data set again from its folder (`trainflow "
    "stage --data FOLDER`), and check who can write to the container"
)


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


def checked_rows(lines: Iterable[bytes | str], name: str, layout: str = IMAGENET_LAYOUT) -> Iterator[list]:
    """The manifest's file rows (after its header), each checked by `row_problem` for the data set's `layout`; lines
    are numbered from 2."""
    for number, line in enumerate(lines, start=2):
        if line.strip():
            row = parsed(line, name, number)
            if problem := row_problem(row, layout):
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
    if header_layout(header) not in LAYOUTS:
        return f"has layout {header.get('layout')!r}, not one of {', '.join(LAYOUTS)}"
    verified = header.get("verified") or {}
    bad = verified.get("bad", []) if isinstance(verified, dict) else None
    if not isinstance(bad, list) or any(not is_bad_file(entry, header_layout(header)) for entry in bad):
        return "lists a bad file that is not a [path, reason] of the data set"
    return None


def is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def header_layout(header: dict) -> object:
    """The layout a manifest's header says its data set has: the ImageNet layout where it says none (every manifest
    before the files layout)."""
    return header.get("layout", IMAGENET_LAYOUT)


def is_bad_file(entry: object, layout: object = IMAGENET_LAYOUT) -> bool:
    """A `verified.bad` entry: [path, reason] with a path that passes path_problem."""
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str)):
        return False
    return not path_problem(entry[0], str(layout))


def row_problem(row: object, layout: str = IMAGENET_LAYOUT) -> str | None:
    """What makes a manifest row unusable, or None: [path, size, sha256, shard], each as staging writes it."""
    if not (isinstance(row, list) and len(row) == 4):
        return "is not a [path, size, sha256, shard] row"
    path, size, sha256, shard = row
    if problem := path_problem(path, layout):
        return f"names {path!r}, which {problem}"
    if not is_count(size):
        return f"gives {path!r} the size {size!r}, not a byte count"
    if not (isinstance(sha256, str) and SHA256.fullmatch(sha256)):
        return f"gives {path!r} the digest {sha256!r}, not a SHA-256"
    if not (isinstance(shard, str) and HEX_ID.fullmatch(shard)):
        return f"puts {path!r} in shard {shard!r}, not a hexadecimal id"
    return None


def path_problem(path: object, layout: str = IMAGENET_LAYOUT) -> str | None:
    """What keeps a staged path from being written inside a version folder, or None. A path is relative,
    "/"-separated and normalised, free of NUL, backslashes and drive letters, and names a visible file: in the
    ImageNet layout under train/<class>/ or val/<class>/, as staging lists them (nodelib/layout.py)."""
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
    if (longest := max(len(part.encode("utf-8", "surrogatepass")) for part in parts)) > NAME_MAX:
        return f"has a name of {longest} bytes, more than the {NAME_MAX} a file system takes"
    if layout == IMAGENET_LAYOUT and (parts[0] not in SPLITS or len(parts) < 3):
        return "is not under train/<class>/ or val/<class>/"
    try:
        check_name(path)
    except UsageError:
        return "holds a control character or is not valid UTF-8"
    return None
