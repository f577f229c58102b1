"""Model files that a run starts from (--init-from) or that `trainflow predict` classifies with: which framework
wrote one, and what a run recorded of its model. Imports neither torch nor TensorFlow: every trainer and the
orchestrator tell the files apart with it (trainer/models.py reads PyTorch's, trainer/tf/models.py Keras's).

A PyTorch run's model.pt is {"arch", "classes", "image_size", "state_dict"} (torch_adapter.save_model); a torchvision
weights file (resnet50-0676ba61.pth) is the bare state dict. A Keras run's model.keras is Keras's zip (config.json,
metadata.json, model.weights.h5), its model named after its architecture (tf/models.py).
"""

import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodelib.errors import UsageError
from nodelib.scripts import sha256_file

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


def weights_in(content: Any, path: Path, is_tensor: Callable[[Any], bool], option: str, instead: str) -> TorchWeights:
    """The weights in what a PyTorch file held (its tensors as torch or numpy has them: `is_tensor`): a run's
    model.pt, or a bare state dict; anything else, one line naming the file and what to pass `instead`."""
    if isinstance(content, dict) and isinstance(content.get("state_dict"), dict):
        return TorchWeights(
            str(path),
            content["state_dict"],
            content.get("arch"),
            content.get("classes") or [],
            content.get("image_size"),
        )
    if isinstance(content, dict) and content and all(is_tensor(v) for v in content.values()):
        return TorchWeights(str(path), content)
    raise UsageError(f"{option} {path} holds no model weights (a PyTorch file of something else); {instead}")


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


# torchvision's ImageNet weights of the ResNets the TensorFlow and Keras trainers build (each model's DEFAULT weights,
# torchvision/models/resnet.py; tests/unit/trainer/test_torch_files.py keeps them equal to torchvision's): those
# trainers have no torchvision to ask, and load them converted (tf/models.py)
IMAGENET_URLS = {
    name: f"https://download.pytorch.org/models/{name}-{digest}.pth"
    for name, digest in {
        "resnet18": "f37072fd",
        "resnet34": "b627a593",
        "resnet50": "11ad3fa6",
        "resnet101": "cd907fc2",
        "resnet152": "f82ba261",
        "wide_resnet50_2": "9ba9bcbe",
        "wide_resnet101_2": "d733dc28",
    }.items()
}


def torch_cache() -> Path:
    """Where torch.hub keeps downloaded weights (torch.hub.get_dir()'s default, and its checkpoints/ folder)."""
    import os

    home = os.environ.get("TORCH_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "torch")
    return Path(os.path.expanduser(home)) / "hub" / "checkpoints"


def cannot_download(url: str, exc: BaseException) -> UsageError:
    """The one line for weights that cannot be downloaded here: the file, and where to put it instead."""
    return UsageError(
        f"--init-from imagenet: cannot download {url} ({exc}); download it where you can and put it at "
        f"{torch_cache() / Path(url).name}, or pass the file: --init-from FILE"
    )


def named_digest(path: Path) -> str:
    """The SHA-256 prefix torchvision's weights files carry in their names (resnet50-11ad3fa6.pth: 11ad3fa6)."""
    return path.stem.rpartition("-")[2]


def check_cached(path: Path) -> Path:
    """A weights file in torch's cache, checked against the SHA-256 prefix its name carries (torch.hub checks only
    what it downloads: a file cut short, or another one put there, would be loaded as it is)."""
    found = sha256_file(path)
    if not found.startswith(named_digest(path)):
        raise UsageError(
            f"--init-from imagenet: {path} is not torchvision's file of that name (its SHA-256 begins {found[:8]}, "
            f"its name says {named_digest(path)}): it is cut short or another file; delete it (it is downloaded "
            "again) or put the right file there"
        )
    return path


def imagenet_file(arch: str) -> Path:
    """torchvision's ImageNet weights file of `arch` in torch's cache, downloaded there once (as torch.hub does:
    checked against the SHA-256 prefix its name carries) where it is not there yet, and checked so where it is."""
    import os
    import urllib.request

    if arch not in IMAGENET_URLS:
        raise UsageError(f"--init-from imagenet: torchvision has no ImageNet weights for {arch}")
    url = IMAGENET_URLS[arch]
    cached = torch_cache() / Path(url).name
    if cached.is_file():  # torch.hub would load it unchecked
        return check_cached(cached)
    partial = cached.with_name(f".{cached.name}.{os.getpid()}.partial")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as f:
            f.write(response.read())
        if not sha256_file(partial).startswith(named_digest(cached)):
            raise OSError("its SHA-256 is not the one its name gives")
        os.replace(partial, cached)
    except OSError as exc:  # URLError and the socket's errors are OSErrors
        partial.unlink(missing_ok=True)
        raise cannot_download(url, exc) from None
    return cached
