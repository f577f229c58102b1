"""Training jobs behind one interface: submit, stream output, poll, cancel.

A job launches the engine on a pool with horovodrun or torchrun. Its output is sorted by rank into
rank<N>.log (infra/launcher.route_output) and passed on line by line, prefixed by rank. torchrun and
horovodrun both stop every worker when one dies, so a dead worker fails the job at once; the error
names the rank and its last lines. The results folder keeps the engine's checkpoints, so a job
submitted again with the same folder resumes from the newest one.
"""

import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from queue import Queue
from typing import Callable, Iterator, Protocol

from pydantic import BaseModel, ConfigDict, Field

from infra.container_nodes import (DATA, NODE_ENV, RESULTS, ContainerNodes, Mount, commands_on_nodes, running_nodes,
                                   split_lines)
from infra.images import Engine
from infra.launcher import LaunchError, TrainingConfig, route_output
from infra.pools import ProcessPool


class JobTimedOut(LaunchError):
    """The job ran past job.timeout_s and was stopped; another attempt would too, so it is not retried."""


class JobConfig(BaseModel):
    """How long a training job may run."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    timeout_s: float = Field(172800, ge=0)
    """Seconds before the job is stopped and fails (0: no limit). ResNet-50 on ImageNet takes about a day on 8 GPUs."""


class Job(Protocol):
    """The one interface every job backend has."""

    def submit(self) -> None: ...

    def lines(self) -> Iterator[str]: ...

    def poll(self) -> int | None: ...

    def cancel(self) -> None: ...


@dataclass
class ProcessJob:
    """The launcher as a local process group on a process pool."""

    pool: ProcessPool
    command: list[str]
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def submit(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1, start_new_session=True)
        self.pool.record_process(self.proc.pid)

    def lines(self) -> Iterator[str]:
        return iter(self.proc.stdout)

    def poll(self) -> int | None:
        return self.proc.poll()

    def cancel(self) -> None:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=wait)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue


@dataclass
class ContainerJob:
    """The launcher commands on a docker pool, the i-th on node i: horovodrun on node0 (which starts the other
    nodes' workers over SSH), or one torchrun per node. A node whose command fails stops the others."""

    nodes: ContainerNodes
    commands: list[list[str]]
    execs: list[str] = field(default_factory=list, repr=False)
    streams: list[Iterator[bytes]] = field(default_factory=list, repr=False)

    def submit(self) -> None:
        for index, command in enumerate(self.commands):
            exec_id, stream = self.nodes.start(index, command, NODE_ENV)
            self.execs.append(exec_id)
            self.streams.append(stream)

    def lines(self) -> Iterator[str]:
        return merged_lines([split_lines(stream) for stream in self.streams], self._stop_others_if_failed)

    def _stop_others_if_failed(self, index: int) -> None:
        """Called when node `index`'s output ends: a failed node fails the job at once."""
        for _ in range(100):  # its exit status follows the end of its output within moments
            if (code := self._exit_code(self.execs[index])) is not None:
                break
            threading.Event().wait(0.05)
        if code and any(self._exit_code(e) is None for e in self.execs):
            self.cancel()

    def _exit_code(self, exec_id: str) -> int | None:
        state = self.nodes.engine.api.exec_inspect(exec_id)
        return None if state["Running"] else state["ExitCode"]

    def poll(self) -> int | None:
        codes = [self._exit_code(e) for e in self.execs]
        return None if None in codes else next((c for c in codes if c), 0)

    def cancel(self) -> None:
        # On every node: SIGTERM to every process but the node's init (sshd), so launchers and workers stop.
        for index in range(len(self.nodes.names)):
            self.nodes.engine.api.exec_start(self.nodes.engine.api.exec_create(
                self.nodes.container(index), ["sh", "-c", "kill -TERM -1"])["Id"])


def merged_lines(sources: list[Iterator[str]], ended: Callable[[int], None]) -> Iterator[str]:
    """The lines of every source as they come; `ended(i)` is called when source i has no more."""
    if len(sources) == 1:
        yield from sources[0]
        ended(0)
        return
    queue: Queue[tuple[int, str | None]] = Queue()

    def read(index: int) -> None:
        try:
            for line in sources[index]:
                queue.put((index, line))
        finally:
            queue.put((index, None))

    for index in range(len(sources)):
        threading.Thread(target=read, args=(index,), daemon=True).start()
    remaining = len(sources)
    while remaining:
        index, line = queue.get()
        if line is None:
            remaining -= 1
            ended(index)
        else:
            yield line


def run_job(job: Job, log_dir: Path, echo: Callable[[str], None], timeout_s: float) -> int:
    """Submit `job`, stream its output into log_dir and `echo`, and wait; cancel it past `timeout_s` (0: none)."""
    job.submit()
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        job.cancel()

    timer = threading.Timer(timeout_s, expire) if timeout_s else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        return route_output(job.lines(), lambda: wait_for(job), log_dir, echo)
    except LaunchError as exc:
        if timed_out.is_set():
            raise JobTimedOut(f"the job ran past its timeout of {timeout_s:g} s and was stopped; "
                              f"raise job.timeout_s or train for less. {exc}") from None
        raise
    except BaseException:  # cancelled (Prefect cancellation, Ctrl-C): stop the workers too
        job.cancel()
        raise
    finally:
        if timer:
            timer.cancel()


def wait_for(job: Job, interval: float = 0.2) -> int:
    """Poll until the job ends; its exit status."""
    while (status := job.poll()) is None:
        threading.Event().wait(interval)
    return status


def train_on_nodes(engine: Engine, image: str, cfg: TrainingConfig, data: Path, out: Path, run_id: str,
                   echo: Callable[[str], None]) -> dict:
    """Train on one container node per worker: `data` mounted read-only, results written to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    mounts = [Mount(data, DATA), Mount(out, RESULTS, read_only=False)]
    with running_nodes(engine, image, cfg.workers, run_id, mounts) as nodes:
        run_job(ContainerJob(nodes, commands_on_nodes(cfg, nodes, slots=1)), out / "logs", echo, 0)
    return json.loads((out / "metrics.json").read_text())
