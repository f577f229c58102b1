"""Models by name from torchvision, kept apart from how they are parallelised."""

import pickle
import zipfile
from pathlib import Path

import torch
import torchvision

from nodelib.errors import UsageError
from trainer.model_files import (
    IMAGENET,
    KERAS,
    TorchWeights,
    arch_named_by,
    cannot_download,
    check_cached,
    check_model_file,
    framework_of,
    torch_cache,
    weights_in,
)
from trainer.options import check_model_in


def model_names() -> list[str]:
    """The torchvision classification models that can be trained by name."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


def build_model(name: str, num_classes: int) -> torch.nn.Module:
    """A freshly initialised torchvision classifier with `num_classes` outputs (no downloaded weights)."""
    check_model_name(name)
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def check_model_name(name: str) -> None:
    """Fail with known names when `name` is not a classifier of this torchvision."""
    check_model_in(name, model_names())


def start_from(model: torch.nn.Module, source: str, arch: str, classes: list[str]) -> dict:
    """Load the weights --init-from names into `model` (a fresh `arch` for `classes`): every tensor whose name and
    shape fit; the classifier is new unless the weights were trained on these very classes. What was loaded, for
    the log and metrics.json; weights of another framework or architecture: one line naming both."""
    weights = imagenet_weights(arch) if source == IMAGENET else read_weights(Path(source))
    own = model.state_dict()
    fits = {n: t for n, t in weights.tensors.items() if n in own and own[n].shape == t.shape}
    head = classifier_names(model, len(classes))
    new = [n for n in own if n not in fits and not n.endswith("num_batches_tracked")]
    if (weights.arch and weights.arch != arch) or set(new) - head:
        raise UsageError(other_architecture(weights, arch, len(fits), len(own)))
    if weights.classes != classes:  # a classifier trained on other classes (or in another order) names wrong ones
        fits = {n: t for n, t in fits.items() if n not in head}
        new = [n for n in own if n not in fits and not n.endswith("num_batches_tracked")]
    model.load_state_dict(fits, strict=False)
    return {"source": weights.source, "loaded": len(fits), "tensors": len(own), "new": new}


def classifier_names(model: torch.nn.Module, num_classes: int) -> set[str]:
    """The tensors of the model's classifiers: the last layer with parameters (fc, classifier.6, heads.head) and any
    auxiliary one (GoogLeNet's, Inception's), the layers whose output is one value per class."""
    params = list(model.named_parameters())
    last = params[-1][0].rpartition(".")[0]
    per_class = {n.rpartition(".")[0] for n, p in params if p.shape[:1] == (num_classes,)}
    auxiliary = {m for m in per_class if "aux" in m.lower()}
    names = [n for n, _ in params]
    return {n for n in names if n.rpartition(".")[0] in {last} | auxiliary}


def read_weights(path: Path) -> TorchWeights:
    """A PyTorch weights file; a Keras model: one line saying which framework trains from it."""
    if path.is_file() and framework_of(path) == KERAS:
        raise UsageError(
            f"--init-from {path} is a Keras model (model.keras): the PyTorch trainer starts from PyTorch weights; "
            "pass a model.pt of a PyTorch run, or train with --framework keras"
        )
    return read_torch(path, "--init-from")


def read_torch(path: Path, option: str) -> TorchWeights:
    """The tensors of a PyTorch model file (a run's model.pt, or a torchvision weights file), on the CPU;
    a file that is not one: one line naming it and what to pass instead (`option`, the option that named it, says
    what: --init-from starts from torchvision's weights too, --model of `trainflow predict` from a run's model)."""
    check_model_file(path, option)
    instead = what_to_pass(option)
    if not zipfile.is_zipfile(path) and not starts_as_pickle(path):  # torch.load's error would be about pickles
        raise UsageError(f"{option} {path} cannot be read as PyTorch weights ({NOT_TORCH}); {instead}")
    if is_torchscript(path):  # torch.load's advice would be to load it unsafely
        raise UsageError(
            f"{option} {path} is a TorchScript archive (torch.jit.save), a program, not weights; trainflow reads "
            f"weights only: save the model's state_dict() with torch.save, or {instead}"
        )
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except (*UNREADABLE, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        why = unreadable_why(exc)
        whole = (
            "; it is a whole pickled model, not its weights: save its state_dict() with torch.save"
            if (why.startswith("Unsupported global"))
            else ""
        )
        raise UsageError(f"{option} {path} cannot be read as PyTorch weights ({why}){whole}; {instead}") from None
    return weights_in(content, path, lambda v: isinstance(v, torch.Tensor), option, instead)


def is_torchscript(path: Path) -> bool:
    """Whether a zip file is a TorchScript archive: torch.jit.save writes its code (code/) and constants.pkl."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/constants.pkl") or "/code/" in name for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def what_to_pass(option: str) -> str:
    """The fix that ends read_torch's refusals: what the option named by `option` takes."""
    if option == "--init-from":
        return "pass a model.pt of an earlier run or a torchvision weights file"
    return "pass a model.pt or model.keras of an earlier run, or its run id"


# What torch.load raises on bytes that are not its format: the weights-only unpickler fails on a stranger's pickle
# with whatever its opcodes meet (a missing memo entry is a KeyError)
UNREADABLE = (RuntimeError, EOFError, ValueError, OSError, KeyError, IndexError, TypeError, AttributeError)


def starts_as_pickle(path: Path) -> bool:
    """Whether the file starts as a pickle of protocol 2 or later does: torch.save's format before its zip files."""
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"


def unreadable_why(exc: Exception) -> str:
    """Why torch.load refused a file, in a few words: the weights-only unpickler's own reason (after a paragraph
    on loading it unsafely, which is not the fix here), or the first line of the error; a lookup that failed inside
    the unpickler (a KeyError of 101: bytes read as a memo entry) says only that torch.save did not write it."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    unpickler = [line.removeprefix(UNPICKLER) for line in lines if line.startswith(UNPICKLER)]
    if unpickler:
        return unpickler[0].split(". ")[0]
    if isinstance(exc, (KeyError, IndexError)) or not lines:
        return NOT_TORCH
    return lines[0]


NOT_TORCH = "not a file that torch.save wrote"
UNPICKLER = "WeightsUnpickler error: "  # where torch.load's error for a pickle it will not load gives the reason


def imagenet_weights(arch: str) -> TorchWeights:
    """torchvision's ImageNet weights of `arch` (its DEFAULT set), from torch's cache, downloaded there once; where
    the download cannot be reached, one line naming the file and where to put it."""
    try:
        weights = torchvision.models.get_model_weights(arch).DEFAULT
    except (ValueError, KeyError):
        raise UsageError(f"--init-from imagenet: torchvision has no ImageNet weights for {arch}") from None
    if (cached := torch_cache() / Path(weights.url).name).is_file():
        check_cached(cached)  # torch.hub loads a cached file unchecked
    try:
        tensors = weights.get_state_dict(progress=False, check_hash=True)
    except OSError as exc:  # URLError and the socket's errors are OSErrors
        raise cannot_download(weights.url, exc) from None
    return TorchWeights(f"imagenet ({Path(weights.url).name})", tensors, arch, list(weights.meta["categories"]))


def other_architecture(weights: TorchWeights, arch: str, fit: int, tensors: int) -> str:
    """The one line for weights that are not `arch`'s, naming both architectures where the file says its own."""
    theirs = weights.arch or arch_named_by(Path(weights.source), model_names())
    if theirs and theirs != arch:
        return (
            f"--init-from {weights.source} holds a {theirs} model, and this run trains {arch}: pass --model "
            f"{theirs}, or weights of a {arch}"
        )
    return (
        f"--init-from {weights.source} holds weights of another architecture than {arch} (only {fit} of {arch}'s "
        f"{tensors} tensors fit them); pass weights of a {arch}, or the --model they were trained as"
    )


def build_on_meta(name: str, num_classes: int) -> tuple[torch.nn.Module, dict[str, list]]:
    """The model with every tensor on the meta device (no memory), and for each tensor name the initialisers a real
    build runs on it, each with the random state it starts from: materialise() then gives any part of the model
    exactly the values build_model() gives it, holding only that part. The build itself holds one tensor at a time."""
    check_model_name(name)
    recorder = InitRecorder()
    with torch.device("meta"), recorder:
        model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    return model, recorder.by_name(model)


class InitRecorder(torch.overrides.TorchFunctionMode):
    """Records every in-place call on a meta tensor (the initialisers) with the CPU random state before it, and runs
    it once on a scratch CPU tensor of the same shape, so the random stream advances exactly as in a real build."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []
        self.scratch: dict[torch.dtype, torch.Tensor] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name, target = (
            getattr(func, "__name__", ""),
            args[0] if args else kwargs.get("tensor"),
        )  # torch.nn.init: tensor=
        if name.endswith("_") and not name.endswith("__") and isinstance(target, torch.Tensor) and target.is_meta:
            self.calls.append((target, func, args, kwargs, torch.get_rng_state()))
            call(func, args, kwargs, target, self.scratch_like(target))
        return func(*args, **kwargs)

    def scratch_like(self, target: torch.Tensor) -> torch.Tensor:
        """A CPU tensor shaped like `target`, a view of one buffer per type that grows to the largest tensor: a fresh
        tensor each time would leave the freed ones behind as fragments of the heap (400 MB for wide_resnet101_2)."""
        buffer = self.scratch.get(target.dtype)
        if buffer is None or buffer.numel() < target.numel():
            buffer = self.scratch[target.dtype] = torch.empty(2 * target.numel(), dtype=target.dtype, device="cpu")
        return buffer[: target.numel()].view(target.shape)

    def by_name(self, model: torch.nn.Module) -> dict[str, list]:
        """The recorded calls of each of the model's parameters and buffers, by state-dict name, in order."""
        names = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
        recipe: dict[str, list] = {n: [] for n in names.values()}
        for target, func, args, kwargs, state in self.calls:
            if id(target) in names:
                recipe[names[id(target)]].append((func, args, kwargs, state, target))
        return recipe


def materialise(model: torch.nn.Module, names, recipe: dict[str, list], device: torch.device) -> None:
    """Give the tensors `names` of a model from build_on_meta their initial values on `device`, one at a time (each
    made on the CPU, where a real build draws its random numbers); the global random state is left as it was."""
    after = torch.get_rng_state()
    for name in names:
        put(model, name, initialised(tensor_named(model, name), recipe[name]).to(device))
    torch.set_rng_state(after)


@torch.no_grad()
def initialised(meta: torch.Tensor, calls: list) -> torch.Tensor:
    """A CPU tensor shaped like `meta` after the recorded initialisers, each from its recorded random state."""
    if not calls:
        raise RuntimeError("a tensor no initialiser touched cannot be materialised")  # a model built another way
    real = torch.empty(meta.shape, dtype=meta.dtype, device="cpu")
    for func, args, kwargs, state, recorded in calls:
        torch.set_rng_state(state)
        call(func, args, kwargs, recorded, real)
    return real


def call(func, args: tuple, kwargs: dict, target: torch.Tensor, instead: torch.Tensor):
    """func(*args, **kwargs) with the tensor `target` replaced by `instead`, where it appears."""
    return func(
        *(instead if a is target else a for a in args), **{k: instead if v is target else v for k, v in kwargs.items()}
    )


def forget(model: torch.nn.Module, names) -> None:
    """Put the tensors `names` back on the meta device (their memory is freed)."""
    for name in names:
        put(model, name, torch.empty_like(tensor_named(model, name), device="meta"))


def tensor_named(model: torch.nn.Module, name: str) -> torch.Tensor:
    """A parameter or buffer by its state-dict name."""
    owner, _, leaf = name.rpartition(".")
    return getattr(model.get_submodule(owner), leaf)


def put(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Replace the parameter or buffer `name` with `tensor` (a parameter stays a parameter)."""
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    if (old := module._parameters.get(leaf)) is not None:
        tensor = torch.nn.Parameter(tensor, requires_grad=old.requires_grad)
    setattr(module, leaf, tensor)
