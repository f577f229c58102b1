"""Models by name from torchvision, kept apart from how they are parallelised."""

import torch
import torchvision

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
