"""Accuracy, throughput and the facts a run records about itself."""

import hashlib
import platform

import torch
import torchvision

from trainer.throughput import (  # noqa: F401 - the torch-free half of this module's API, for its users
    Throughput,
    digest_chunks,
    installed_versions,
    wait_share,
)


def topk_correct(logits: torch.Tensor, targets: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> list[int]:
    """How many targets are among the top-k predictions, for each k (k capped at the class count)."""
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    hits = top == targets.unsqueeze(1)
    return [int(hits[:, :k].any(dim=1).sum()) for k in ks]


def parameter_digest(named_parameters) -> str:
    """SHA-256 of every (name, parameter) pair given, e.g. model.named_parameters() (not buffers: batch-norm
    statistics stay per worker)."""
    h = hashlib.sha256()
    for name, value in named_parameters:
        h.update(name.encode())
        h.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def held(model: torch.nn.Module) -> tuple[int, int]:
    """(parameters, bytes of parameters and buffers) that `model` holds in memory: tensors on the meta device
    (the parts of a pipeline-parallel model that other ranks hold) are not counted."""
    params = [p for p in model.parameters() if not p.is_meta]
    buffers = [b for b in model.buffers() if not b.is_meta]
    return sum(p.numel() for p in params), sum(t.numel() * t.element_size() for t in [*params, *buffers])


def library_versions() -> dict[str, str]:
    """Versions of what the run depends on."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda or "none",
        **installed_versions("horovod"),
    }
