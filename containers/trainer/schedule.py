"""Learning-rate schedule for large-batch synchronous SGD (Goyal et al. 2017, "Accurate, Large Minibatch SGD").

The learning rate scales linearly with the number of workers. Training starts at the one-worker rate
and ramps linearly to the scaled rate over the warmup epochs, then follows a step or cosine decay.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """Shape of the learning-rate curve, as a factor on the one-worker base rate."""

    steps_per_epoch: int
    epochs: int
    world_size: int = 1
    warmup_epochs: float = 0.0
    kind: str = "cosine"
    """"step" (decay by `decay_factor` at each of `decay_epochs`) or "cosine" (to zero at the end)."""
    decay_epochs: tuple[float, ...] = (30.0, 60.0, 80.0)
    decay_factor: float = 0.1


def lr_factor(step: int, s: Schedule) -> float:
    """Factor on the base learning rate at optimizer step `step` (0-based)."""
    epoch = step / s.steps_per_epoch
    peak = float(s.world_size)
    if epoch < s.warmup_epochs:
        return 1.0 + (peak - 1.0) * epoch / s.warmup_epochs
    if s.kind == "step":
        return peak * s.decay_factor ** sum(epoch >= e for e in s.decay_epochs)
    span = max(s.epochs - s.warmup_epochs, 1e-9)
    progress = min((epoch - s.warmup_epochs) / span, 1.0)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
