"""The record of a checked data version: DATA/.verified.json (`write_verified`, `read_verified`).

{"format": 1, "version": V, "files": N, "check": "decode", "bad": [[path relative to DATA, reason], ...]}. The trainer
trusts it instead of decoding the images again; one that is not valid is a UsageError naming it.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

from nodelib.errors import UsageError
from nodelib.image_files import one_line

VERIFIED = ".verified.json"  # in a data folder's root: the check of its data version (hidden from the index)


@dataclass(frozen=True)
class Verified:
    """The check of a data version: which version, how many images were checked, how, and the bad ones (paths
    relative to the data folder, with the reason)."""

    version: str
    files: int
    check: str
    bad: list[tuple[str, str]]


def write_verified(data_dir: Path, version: str, files: int, bad: list[tuple[str, str]], check: str = "decode") -> Path:
    """Write DATA/.verified.json (atomically: a reader never sees half of it); its path. `bad` holds paths
    relative to DATA; `files` counts every image checked, the bad ones included."""
    return write_record(Path(data_dir) / VERIFIED, Verified(version, files, check, bad))


def write_record(path: Path, record: Verified) -> Path:
    """A verification record as JSON at `path`, written to a temporary name and renamed."""
    body = {
        "format": 1,
        "version": record.version,
        "files": record.files,
        "check": record.check,
        "bad": [[p, one_line(why)] for p, why in record.bad],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(body, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(partial, path)
    return path


def read_verified(data_dir: Path) -> Verified | None:
    """DATA/.verified.json, or None when the folder has none; one that is not valid is a UsageError naming it."""
    return read_record(Path(data_dir) / VERIFIED)


def read_record(path: Path) -> Verified | None:
    """The verification record at `path` (None when there is none), checked field by field."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _invalid(path, f"not readable JSON: {one_line(str(exc))}") from None
    if why := record_problem(body):
        raise _invalid(path, why)
    return Verified(body["version"], body["files"], body["check"], [(p, why) for p, why in body["bad"]])


def record_problem(body: object) -> str | None:
    """What makes `body` no verification record of format 1, or None."""
    if not isinstance(body, dict) or body.get("format") != 1:
        return 'it needs "format": 1'
    if not isinstance(body.get("version"), str) or not body["version"]:
        return '"version" must name the data version'
    if not isinstance(body.get("files"), int) or isinstance(body["files"], bool) or body["files"] < 0:
        return '"files" must be the number of images checked'
    if body.get("check") != "decode":
        return '"check" must be "decode" (every image decoded)'
    bad = body.get("bad")
    if not isinstance(bad, list) or not all(_is_bad_entry(entry) for entry in bad):
        return '"bad" must be a list of [path relative to the data folder, reason]'
    return None


def _is_bad_entry(entry: object) -> bool:
    """[relative path inside the folder, reason]."""
    if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) and x for x in entry)):
        return False
    return not os.path.isabs(entry[0]) and ".." not in Path(entry[0]).parts


def _invalid(path: Path, why: str) -> UsageError:
    """The error for a record that cannot be trusted, naming it and the two ways out."""
    return UsageError(
        f"{path} is not a valid verification record ({why}); delete it to decode the images again, "
        "or sync the data version again"
    )
