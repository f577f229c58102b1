"""Training jobs behind one interface: submit, stream output, poll, cancel.

A job launches the engine on a pool with horovodrun or torchrun. Its output is sorted by rank into
rank<N>.log (infra/launcher.route_output) and passed on line by line, prefixed by rank. torchrun and
horovodrun both stop every worker when one dies, so a dead worker fails the job at once; the error
names the rank and its last lines. The results folder keeps the engine's checkpoints, so a job
submitted again with the same folder resumes from the newest one.
"""

import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol

from pydantic import BaseModel, ConfigDict, Field

from infra.container_nodes import ContainerNodes, split_lines
from infra.launcher import LaunchError, route_output
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
    """The launcher run on node0 of a docker pool; it starts the other nodes' workers over SSH."""

    nodes: ContainerNodes
    command: list[str]
    exec_id: str | None = field(default=None, repr=False)
    chunks: Iterator[bytes] | None = field(default=None, repr=False)

    def submit(self) -> None:
        api = self.nodes.engine.api
        self.exec_id = api.exec_create(self.nodes.container(0), self.command, workdir="/opt/trainflow")["Id"]
        self.chunks = api.exec_start(self.exec_id, stream=True)

    def lines(self) -> Iterator[str]:
        return split_lines(self.chunks)

    def poll(self) -> int | None:
        state = self.nodes.engine.api.exec_inspect(self.exec_id)
        return None if state["Running"] else state["ExitCode"]

    def cancel(self) -> None:
        # On every node: SIGTERM to every process but the node's init (sshd), so launcher and workers stop.
        for index in range(len(self.nodes.names)):
            self.nodes.engine.api.exec_start(self.nodes.engine.api.exec_create(
                self.nodes.container(index), ["sh", "-c", "kill -TERM -1"])["Id"])


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
