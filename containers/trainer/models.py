"""Models by name from torchvision, kept apart from how they are parallelised."""

import torch
import torchvision

from trainer.errors import UsageError


def model_names() -> list[str]:
    """The torchvision classification models that can be trained by name."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


def build_model(name: str, num_classes: int) -> torch.nn.Module:
    """A freshly initialised torchvision classifier with `num_classes` outputs (no downloaded weights)."""
    check_model_name(name)
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def check_model_name(name: str) -> None:
    """Fail with the list of known names when `name` is not a torchvision classifier."""
    names = model_names()
    if name not in names:
        close = [n for n in names if n.startswith(name[:4])][:8] or names[:8]
        raise UsageError(
            f"unknown model {name!r}; pick a torchvision classifier such as {', '.join(close)}"
        )
