"""JSON files that trainflow keeps on this machine (the hash cache, run records): read forgivingly, written whole."""

import json
import os
from pathlib import Path

from infra.core.diskspace import writing


def read_json(path: Path) -> dict:
    """The mapping in `path` ({} when there is none, it cannot be read, or it holds something else)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def write_json(path: Path, values: dict, indent: int | None = None) -> None:
    """Write `values` to `path` through a temporary file, so a reader never sees half of it (a full disk keeps the
    previous file and ends in one line, infra/core/diskspace.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    text = json.dumps(values, indent=indent) + "\n" * bool(indent)
    with writing(path, len(text.encode()), tmp):
        tmp.write_text(text)
        os.replace(tmp, path)
