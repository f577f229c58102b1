"""Where a trainer may write: the nearest folder that exists, and why one cannot be written in."""

import os
from pathlib import Path


def nearest_existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists: where a folder to be made at `path` would be made."""
    return next((p for p in [path, *path.parents] if os.path.lexists(p)), Path("."))


def cannot_write_in(folder: Path) -> str | None:
    """Why no file can be made in `folder` (None when one can): a file is made there and removed."""
    probe = folder / f".write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return exc.strerror
    return None
