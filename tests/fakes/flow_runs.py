"""Runs of train-flow in the tests: small training settings, a config around them, and a killer of rank 1's
worker (SIGKILL, as a lost node) for the tests that a worker dies in."""

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil

from flows.config import FlowConfig

SMALL = dict(
    model="resnet18",
    epochs=1,
    batch_size=16,
    image_size=32,
    hflip=False,
    loader_workers=1,
    threads=1,
    warmup_epochs=0,
    lr=0.05,
    log_every=5,
)


def flow_config(workdir: Path, data: Path | str, **sections) -> FlowConfig:
    """The flow's settings for `data` under `workdir`: SMALL's training, overridden by `sections`."""
    values = {"workdir": workdir, "data": str(data), "training": {**SMALL, **sections.pop("training", {})}, **sections}
    return FlowConfig.model_validate(values)


def kill_rank_one(done: threading.Event, times: int, ready, kills: list[float], mine) -> None:
    """Kill the rank-1 worker (SIGKILL, no last words) of this test's run (`mine(proc, argv)`: the suite runs two
    tests at once, and the other's workers are not this one's to kill) once `ready()` holds, `times` times; `kills`
    gets the time.monotonic() of each kill."""
    while times and not done.is_set():
        for proc in psutil.process_iter(["cmdline"]):
            try:
                argv = proc.info["cmdline"] or []
                if (
                    any(a.endswith("train.py") for a in argv)
                    and "--check" not in argv
                    and mine(proc, argv)
                    and proc.environ().get("RANK") == "1"
                ):
                    while not ready() and not done.is_set():
                        time.sleep(0.2)
                    proc.kill()
                    kills.append(time.monotonic())
                    times -= 1
                    break
            except (psutil.Error, OSError):
                continue
        time.sleep(0.5)


def writing_under(folder: Path):
    """A process pool's worker of a run under `folder` (its --out is there)."""
    return lambda proc, argv: str(folder) in " ".join(argv)


def in_a_container(proc: psutil.Process, argv: list[str]) -> bool:
    """A container node's process (another PID namespace): one worker of the suite runs every Docker test."""
    return os.readlink(f"/proc/{proc.pid}/ns/pid") != os.readlink("/proc/self/ns/pid")


@contextmanager
def killing_rank_one(mine, times: int, ready=lambda: True):
    done, kills = threading.Event(), []
    threading.Thread(target=kill_rank_one, args=(done, times, ready, kills, mine), daemon=True).start()
    try:
        yield kills
    finally:
        done.set()
