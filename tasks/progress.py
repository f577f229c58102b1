"""Live progress of the training step in the Prefect UI, from the trainer's `Progress` events (nodelib/records.py,
every training.log_every steps, on every backend: they are lines of the job's stream): a progress artifact that
moves as steps pass, described by a markdown line with the step, the images/s and the ETA. For a user's script, the
line holds the latest value of each metric read from its lines as they come."""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast
from uuid import UUID

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from nodelib.records import Event, Progress

KEY = "training-progress"


@dataclass(frozen=True)
class StepSeen:
    """One progress line: where training is, out of how many steps in all."""

    epoch: int
    epochs: int
    step: int
    total: int
    images_per_sec: float

    @property
    def percent(self) -> float:
        return min(100.0, 100.0 * self.step / max(self.total, 1))


def read_step(event: Event, epochs: int) -> StepSeen | None:
    """Where a Progress event says training is (None for another event); `epochs` is training.epochs."""
    if not isinstance(event, Progress):
        return None
    return StepSeen(event.epoch, epochs, event.step, event.steps_per_epoch * epochs, event.images_per_sec)


def eta_seconds(first: tuple[float, int], now: float, step: int, total: int) -> float | None:
    """Seconds left at the pace since `first` (time, step): None until a step has passed since then."""
    at, start = first
    if step <= start or now <= at:
        return None
    return (total - step) * (now - at) / (step - start)


def eta_text(seconds: float | None) -> str:
    """An ETA for people: "1 h 05 min", "4 min 10 s", "12 s"; "measuring" before there is a pace."""
    if seconds is None:
        return "measuring"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def progress_markdown(seen: StepSeen, eta: float | None) -> str:
    """The line under the progress bar."""
    return (
        f"**training**: epoch {seen.epoch}/{seen.epochs}, step {seen.step}/{seen.total}, "
        f"{seen.images_per_sec:.1f} images/s, ETA {eta_text(eta)}"
    )


class ProgressArtifact:
    """The training step's progress artifact, updated from progress lines at most every `interval` seconds."""

    def __init__(self, epochs: int, interval: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.epochs, self.interval, self.clock = epochs, interval, clock
        self.first: tuple[float, int] | None = None
        self.updated = float("-inf")
        self.last: StepSeen | None = None
        self.metrics: dict[str, float] = {}  # a user's script's latest values, by name
        # prefect's async_dispatch types the result as UUID or a coroutine: called from the (sync) training step it
        # runs the sync version, a UUID
        self.id = cast(UUID, create_progress_artifact(0.0, key=KEY, description="**training**: starting"))

    def see(self, event: Event) -> None:
        """Take an event of the job; a Progress event moves the artifact (if `interval` has passed)."""
        seen = read_step(event, self.epochs)
        if seen is None:
            return
        now, self.last = self.clock(), seen
        self.first = self.first or (now, seen.step)
        if now - self.updated >= self.interval:
            self.updated = now
            eta = eta_seconds(self.first, now, seen.step, seen.total)
            update_progress_artifact(self.id, seen.percent, description=progress_markdown(seen, eta))

    def see_metrics(self, values: dict[str, float]) -> None:
        """Take the metrics a user's script printed (the latest of each is shown, if `interval` has passed)."""
        self.metrics.update(values)
        now = self.clock()
        if now - self.updated >= self.interval:
            self.updated = now
            percent = self.last.percent if self.last else 0.0
            update_progress_artifact(self.id, percent, description=f"**training**: {metrics_text(self.metrics)}")

    def finish(self) -> None:
        """The job completed: 100%."""
        done = (
            f"epoch {self.last.epochs}/{self.last.epochs}, step {self.last.total}/{self.last.total}"
            if self.last
            else metrics_text(self.metrics)
        )
        update_progress_artifact(self.id, 100.0, description=f"**training**: complete {done}".strip())


def metrics_text(metrics: dict[str, float]) -> str:
    """A script's latest metrics in a line: "loss 0.4312, iou 0.612"."""
    return ", ".join(f"{name} {value:.4g}" for name, value in metrics.items())


@contextmanager
def training_progress(epochs: int) -> Iterator[ProgressArtifact]:
    """A progress artifact for the training step, moved by the job's events (`see`) or a script's metrics
    (`see_metrics`); 100% when the block completes."""
    artifact = ProgressArtifact(epochs)
    yield artifact
    artifact.finish()
