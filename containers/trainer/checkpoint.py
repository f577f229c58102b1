"""Checkpoints and result files, written atomically so that a crash never leaves a torn file.

A pipeline-parallel checkpoint is one file per stage: step-N.pt (progress, and stage 0's part) written last,
after step-N.stage-S.pt of every later stage; each part holds its tensors under the single-device model's names
and its optimizer state under the single-device optimizer's indices, so load_checkpoint() merges them into the
single-device model's checkpoint.

torch is imported only by the functions that write or read torch files: the TensorFlow trainers (trainer/tf) use
write_atomic and save_json in an image without torch.

A disk too full for a file ends the run in one line (nodelib/errors.py's DiskFull) before the write starts where
the size is known (a checkpoint's tensors), else when the disk fills; either way the temporary file goes and the
files written before stay whole, so the next run resumes from the newest checkpoint."""

import json
import os
import re
from pathlib import Path

from nodelib.errors import check_free, writing

CHECKPOINT = re.compile(r"step-(\d{9})\.pt$")
FIX = "free space there, or pass an --out on a bigger disk; a re-run resumes from the newest checkpoint"


def write_atomic(path: Path, write, need: int | None = None) -> Path:
    """Call write(tmp_path), then rename the temporary file over `path`; `need`, the bytes it will take when known,
    is checked against the free space first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if need:
        check_free(path, need, FIX)
    with writing(path, need, tmp, FIX):
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, path)
    return path


def save_json(path: Path, obj) -> Path:
    """Write JSON atomically."""
    return write_atomic(path, lambda p: p.write_text(json.dumps(obj, indent=2) + "\n"))


def save_torch(path: Path, obj) -> Path:
    """torch.save atomically, the tensors' bytes checked against the free space first."""
    import torch

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # to a file, not a path: torch's own writer hides ENOSPC in a RuntimeError
            torch.save(obj, f)

    return write_atomic(path, save, tensor_bytes(obj))


def tensor_bytes(obj) -> int:
    """The bytes of the tensors in a (nested) state dict: about what torch.save writes."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def save_checkpoint(folder: Path, state: dict, step: int, keep: int = 3) -> Path:
    """Write checkpoints/step-<step>.pt and keep only the newest `keep` checkpoints (with their stage parts)."""
    path = save_torch(checkpoint_path(folder, step), state)
    kept = {p.stem for p in list_checkpoints(folder)[-keep:]} | {path.stem}
    for old in [*folder.glob("step-*.pt"), *folder.glob(".step-*.pt.tmp-*")]:
        if old.name.split(".")[0] not in kept or ".tmp-" in old.name:
            old.unlink(missing_ok=True)  # older checkpoints, and halves left by a killed writer
    return path


def checkpoint_path(folder: Path, step: int) -> Path:
    """The checkpoint of step `step` (a pipeline checkpoint's stage 0 and progress)."""
    return folder / f"step-{step:09d}.pt"


def stage_path(path: Path, stage: int) -> Path:
    """Where a later stage of a pipeline checkpoint keeps its part."""
    return path.with_name(f"{path.stem}.stage-{stage}.pt")


def load_checkpoint(path: Path) -> dict:
    """A checkpoint as the single-device model's: a pipeline checkpoint's stage parts merged into one model and
    one optimizer state. Memory-mapped: a caller that keeps only some tensors reads only those."""
    import torch

    state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    for stage in range(1, state.get("stages", 1)):
        part = torch.load(stage_path(path, stage), map_location="cpu", mmap=True, weights_only=False)
        state["model"].update(part["model"])
        state["optimizer"]["state"].update(part["optimizer"]["state"])
        for group, more in zip(state["optimizer"]["param_groups"], part["optimizer"]["param_groups"]):
            group["params"] = sorted(group["params"] + more["params"])
    return state


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoints in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if CHECKPOINT.match(p.name))


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest checkpoint, or None."""
    found = list_checkpoints(folder)
    return found[-1] if found else None
