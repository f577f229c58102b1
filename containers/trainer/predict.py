"""`trainflow predict` with a PyTorch run's model.pt: the model its run trained, evaluated as its validation was.

The images are decoded by PIL as RGB (image_files.load_rgb: grayscale, CMYK, alpha and 16 bits converted as
training converts them) and transformed by the PIL loader's evaluation transform (data.val_transform: the shorter
side resized to image_size/0.875, the centre crop, normalised), then classified a batch at a time on the GPU where
there is one, in float32 (a run in bf16 validated under autocast: a near tie may fall the other way here).
predictions.py does the rest.
"""

from pathlib import Path

import numpy as np
import torch

from nodelib.errors import UsageError
from nodelib.image_files import load_rgb
from trainer.data import val_transform
from trainer.distributed import pick_device
from trainer.model_files import TorchWeights
from trainer.models import build_model, read_torch

OPTION = "--model"  # the option of `trainflow predict` that names the model file, in every refusal


class TorchClassifier:
    """A run's PyTorch model with its class names and evaluation transform (a predictions.Classifier)."""

    def __init__(self, path: Path):
        weights = read_torch(path, OPTION)
        arch, image_size = described(weights)
        self.classes, self.device = weights.classes, pick_device("auto", 0)
        self.model = loaded(build_model(arch, len(self.classes)), weights, arch).to(self.device).eval()
        self.transform = val_transform(image_size, "pil")

    def prepare(self, path: str) -> torch.Tensor:
        """The image at `path` as the run's validation saw it (PIL loader): a normalised float CHW tensor."""
        return self.transform(load_rgb(path))

    @torch.inference_mode()
    def probabilities(self, images: list) -> np.ndarray:
        """The class probabilities of a batch of prepared images (softmax of the logits, in float32)."""
        logits = self.model(torch.stack(images).to(self.device))
        return torch.softmax(logits.float(), dim=1).cpu().numpy()


def described(weights: TorchWeights) -> tuple[str, int]:
    """(architecture, image size) that a run's model.pt records; bare weights (a torchvision file) say neither, nor
    the class names: one line."""
    if not (weights.arch and weights.classes and weights.image_size):
        raise UsageError(
            f"{OPTION} {weights.source} holds bare weights, without the architecture, class names and image size "
            "that predictions need; pass the model.pt or model.keras of a trainflow run, or its run id"
        )
    return weights.arch, weights.image_size


def loaded(model: torch.nn.Module, weights: TorchWeights, arch: str) -> torch.nn.Module:
    """`model` with the run's weights; weights that do not fit it (a file edited by hand): one line."""
    try:
        model.load_state_dict(weights.tensors)
    except RuntimeError as exc:
        raise UsageError(
            f"{OPTION} {weights.source} says it holds a {arch} of {len(weights.classes)} classes, and its weights do "
            f"not fit one ({str(exc).strip().splitlines()[0]}); pass the model.pt of a trainflow run"
        ) from None
    return model
