"""The TensorFlow and Keras trainers' checkpoints: OUT/checkpoints/step-<9 digits>.npz, one file written atomically by
rank 0, holding every variable of the model (batch-norm statistics included) and of the optimizer (its momentum
slots) and the loop's progress (trainer/core.py's `progress_state`) as JSON; the newest --keep-checkpoints kept."""

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from trainer import checkpoint

CHECKPOINT = re.compile(r"step-(\d{9})\.npz$")


def save(folder: Path, step: int, variables: dict[str, list], progress: dict, keep: int) -> None:
    """Write step-<step>.npz: each list of `variables` ("model", "optimizer") and `progress`; prune the older ones."""
    arrays = {f"{part}/{i}": v.numpy() for part, values in variables.items() for i, v in enumerate(values)}
    need = sum(a.nbytes for a in arrays.values())  # checked against the free space before the write starts
    path = checkpoint.write_atomic(folder / f"step-{step:09d}.npz", lambda p: write_npz(p, arrays, progress), need)
    prune(folder, keep, keep_also=path)


def write_npz(path: Path, arrays: dict[str, Any], progress: dict) -> None:
    """The arrays and the progress (as JSON text) in one uncompressed .npz file."""
    with open(path, "wb") as f:
        np.savez(f, progress=np.array(json.dumps(progress)), **arrays)


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoints in `folder`, oldest first."""
    return sorted(p for p in folder.iterdir() if CHECKPOINT.match(p.name)) if folder.is_dir() else []


def prune(folder: Path, keep: int, keep_also: Path) -> None:
    """Delete all but the newest `keep` checkpoints (and `keep_also`), and halves left by a killed writer."""
    kept = {p.name for p in list_checkpoints(folder)[-keep:]} | {keep_also.name}
    for old in [*list_checkpoints(folder), *folder.glob(".step-*.npz.tmp-*")]:
        if old.name not in kept:
            old.unlink(missing_ok=True)


def newest_progress(folder: Path) -> dict | None:
    """The progress of the newest checkpoint in `folder`, if any (its arrays left unread)."""
    found = list_checkpoints(folder)
    if not found:
        return None
    with np.load(found[-1]) as saved:
        return progress_of(saved)


def progress_of(saved) -> dict:
    """The progress an open checkpoint holds."""
    return json.loads(str(saved["progress"]))


def part_shapes(saved, part: str) -> list[tuple[int, ...]]:
    """The shapes of one part's arrays in an open checkpoint, in order."""
    count = sum(name.startswith(f"{part}/") for name in saved.files)
    return [tuple(saved[f"{part}/{i}"].shape) for i in range(count)]
