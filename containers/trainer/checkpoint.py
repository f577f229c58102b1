"""Checkpoints and result files, written atomically so that a crash never leaves a torn file."""

import json
import os
import re
from pathlib import Path

import torch

CHECKPOINT = re.compile(r"step-(\d{9})\.pt$")


def write_atomic(path: Path, write) -> Path:
    """Call write(tmp_path), then rename the temporary file over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())  # the data is on disk before the name points at it
    os.replace(tmp, path)
    return path


def save_json(path: Path, obj) -> Path:
    """Write JSON atomically."""
    return write_atomic(path, lambda p: p.write_text(json.dumps(obj, indent=2) + "\n"))


def save_torch(path: Path, obj) -> Path:
    """torch.save atomically."""
    return write_atomic(path, lambda p: torch.save(obj, p))


def save_checkpoint(folder: Path, state: dict, step: int, keep: int = 3) -> Path:
    """Write checkpoints/step-<step>.pt and keep only the newest `keep` checkpoints."""
    path = save_torch(folder / f"step-{step:09d}.pt", state)
    for old in list_checkpoints(folder)[:-keep] + list(folder.glob(".step-*.pt.tmp-*")):
        if old.name != path.name:
            old.unlink(missing_ok=True)  # older checkpoints, and halves left by a killed writer
    return path


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoints in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if CHECKPOINT.match(p.name))


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest checkpoint, or None."""
    found = list_checkpoints(folder)
    return found[-1] if found else None
