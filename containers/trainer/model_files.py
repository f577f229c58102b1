"""Model files that a run starts from (--init-from) or that `trainflow predict` classifies with: which framework
wrote one, and what a run recorded of its model. Imports neither torch nor TensorFlow: every trainer and the
orchestrator tell the files apart with it (trainer/models.py reads PyTorch's, trainer/tf/models.py Keras's).

A PyTorch run's model.pt is {"arch", "classes", "image_size", "state_dict"} (torch_adapter.save_model); a torchvision
weights file (resnet50-0676ba61.pth) is the bare state dict. A Keras run's model.keras is Keras's zip (config.json,
metadata.json, model.weights.h5), its model named after its architecture (tf/models.py).
"""

import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.errors import UsageError

PYTORCH, KERAS = "pytorch", "keras"
ABOUT = "trainflow.json"  # in a Keras run's model.keras: its architecture and class names, which Keras's files lack
IMAGENET = "imagenet"  # the named weight set --init-from takes: torchvision's ImageNet weights of the model
MODEL_FILES = {PYTORCH: "model.pt", KERAS: "model.keras"}  # what a run of each framework writes


@dataclass
class TorchWeights:
    """A PyTorch weights file's tensors, and what a run's model.pt says of them (a bare state dict says nothing)."""

    source: str  # the file, as the user named it
    tensors: dict[str, Any]
    arch: str | None = None
    classes: list[str] = field(default_factory=list)
    image_size: int | None = None


def framework_of(path: Path) -> str | None:
    """The framework that wrote the model file `path` ("pytorch" or "keras"), from its directory alone; None for a
    file that is neither (a legacy pickle of torch.save is read as PyTorch's by read_torch)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        with open(path, "rb") as f:
            return KERAS if f.read(4) == b"\x89HDF" else None  # Keras's older HDF5 format
    if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return PYTORCH
    return KERAS if {"config.json", "model.weights.h5"} <= set(names) else None


def check_model_file(path: Path, option: str) -> None:
    """Refuse, in one line, a model file that is missing or not a file."""
    if not path.exists():
        raise UsageError(
            f"{option} {path}: no such file; pass a model.pt or model.keras of an earlier run, or its run id"
        )
    if not path.is_file():
        raise UsageError(f"{option} {path} is a folder, not a model file; pass the model.pt or model.keras in it")


def arch_named_by(path: Path, names: "tuple[str, ...] | list[str]") -> str | None:
    """The architecture a weights file's name gives, as torchvision names its files (resnet50-0676ba61.pth): the
    longest known model name the file's name begins with."""
    stem = path.name.lower()
    matches = [n for n in names if stem == n or stem.startswith(n + "-") or stem.startswith(n + ".")]
    return max(matches, key=len, default=None)


def add_about(keras_file: Path, about: dict) -> None:
    """Add `about` (architecture, class names) to a Keras model file, beside Keras's own members (load_model reads
    only those)."""
    import json

    with zipfile.ZipFile(keras_file, "a") as archive:
        archive.writestr(ABOUT, json.dumps(about))


def read_about(keras_file: Path) -> dict:
    """What a Keras run recorded in its model.keras (arch, classes); empty for a model.keras made elsewhere."""
    import json

    with zipfile.ZipFile(keras_file) as archive:
        if ABOUT not in archive.namelist():
            return {}
        about = json.loads(archive.read(ABOUT))
    return about if isinstance(about, dict) else {}
