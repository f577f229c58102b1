"""Throughput and the facts a run records about itself that need no framework (the TensorFlow trainers use them too:
their image has no torch); trainer/metrics.py adds torch's."""

import importlib.metadata
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


def digest_chunks(digest: str, n: int = 4) -> list[float]:
    """The first n*20 bits of a hex digest as n floats, small enough to sum exactly in float64."""
    return [float(int(digest[i * 5 : (i + 1) * 5], 16)) for i in range(n)]


def installed_versions(*packages: str) -> dict[str, str]:
    """The installed version of each of `packages` that is installed (the others are left out)."""
    versions = {}
    for package in packages:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


@dataclass
class Throughput:
    """The images one rank trained in an epoch: all of them, and those after its first step. The steady rate is
    what every benchmark reports: the first step also infers shapes and allocates, which a long run does once."""

    started: float = field(default_factory=time.perf_counter)
    seen: int = 0
    after_first: tuple[float, int] | None = None  # (time, images) when the epoch's first step ended
    waited: float = 0.0  # seconds spent waiting for the next batch (the loader)
    steps: int = 0
    cpu_after_first: tuple[float, float] | None = None  # (this thread's CPU s, the process's CPU s) after step 1

    def next_batch(self, batches: Iterator):
        """The next batch of `batches` (None after the last), the time spent waiting for it counted."""
        start = time.perf_counter()
        batch = next(batches, None)
        self.waited += time.perf_counter() - start
        return batch

    def data_wait_share(self) -> float:
        """The share of the epoch so far spent waiting for batches rather than computing (and checkpointing)."""
        return wait_share(self.waited, time.perf_counter() - self.started)

    def count(self, images: int) -> None:
        """A step of `images` ended."""
        self.seen, self.steps = self.seen + images, self.steps + 1
        if self.after_first is None:
            self.after_first = (time.perf_counter(), self.seen)
            self.cpu_after_first = (time.thread_time(), time.process_time())

    def rates(self) -> tuple[float, float, float]:
        """(seconds, images/s, steady images/s); with a single step the steady rate is the whole epoch's."""
        now = time.perf_counter()
        seconds, whole = now - self.started, self.seen / max(now - self.started, 1e-9)
        if self.after_first is None or self.seen == self.after_first[1]:
            return seconds, whole, whole
        at, images = self.after_first
        return seconds, whole, (self.seen - images) / max(now - at, 1e-9)

    def cpu_ms_per_step(self) -> tuple[float, float]:
        """CPU milliseconds per step after the first: of the thread that counts (the one that trains) and of the
        process's other threads (gloo's, Horovod's background thread: the all-reduce; with more than one torch
        thread, torch's intra-op pool too). (0, 0) before a second step."""
        if self.steps < 2 or self.cpu_after_first is None:  # count set cpu_after_first at the first step
            return 0.0, 0.0
        thread, process = self.cpu_after_first
        trained, n = time.thread_time() - thread, self.steps - 1
        return 1e3 * trained / n, 1e3 * (time.process_time() - process - trained) / n


def wait_share(waited: float, total: float) -> float:
    """`waited` seconds as a share of `total` seconds, in [0, 1] (0 for no time at all)."""
    return min(max(waited / total, 0.0), 1.0) if total > 0 else 0.0
