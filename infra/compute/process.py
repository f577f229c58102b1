"""The process backend: this machine as a pool of one node, its slots local worker processes.

The job is torchrun or horovodrun as a local process group on a leash (it dies with trainflow), running the trainer
of the scripts version on the local file share against the file server's folder; before it starts, the trainer's
preflight checks everything in one process. The pool's marker folder records the run, its owner and the launcher's
process group, so deleting the pool stops a launcher that still runs and a later run can find the pool
of a crashed one. `trainflow train` runs its workers through this backend too.
"""

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from infra.compute.base import (
    LocalBackend,
    OneAttempt,
    PoolError,
    PoolSection,
    RunConfig,
    RunPaths,
    owner,
    owner_alive,
    train_on_pool,
)
from infra.core.errors import BadInput
from infra.engines.contract import PACKAGE, Metrics, TrainingSettings
from infra.engines.gpus import shared_gpu
from infra.engines.installed import missing_part
from infra.engines.launchers import LaunchError, local_command
from infra.engines.program import NodePaths, Program
from infra.services.supervise import spawn

MARKER = "pool.json"


class ProcessPoolConfig(PoolSection):
    """The process pool: this machine as its one node (nodes is not read), running slots_per_node workers at most."""

    backend: Literal["process"] = "process"


@dataclass
class ProcessPool:
    """This machine as a pool of one node. Its marker folder records the run and the processes it runs."""

    slots: int
    run: RunPaths
    root: Path

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def folder(self) -> Path:
        return self.root / self.run_id

    def create(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / MARKER).write_text(json.dumps({"run": self.run_id, "owner": owner(), "backend": "process"}))

    def wait_until_ready(self) -> None:
        if not (self.folder / MARKER).exists():
            raise PoolError(f"process pool {self.run_id} was not created")

    def describe(self) -> dict:
        return {
            "backend": "process",
            "run_id": self.run_id,
            "nodes": ["localhost"],
            "slots": self.slots,
            "state": "ready" if self.folder.exists() else "deleted",
        }

    def record_process(self, pid: int) -> None:
        """Remember a launcher's process group, so delete() stops it if it still runs."""
        with open(self.folder / "pids", "a") as f:
            f.write(f"{pid}\n")

    def delete(self) -> None:
        remove_pool(self.folder)

    def delete_leftovers(self, keep: set[str]) -> list[str]:
        """Delete the pools of runs whose owning process is gone (crashed runs), other than `keep`; their run ids."""
        gone = sorted(leftover_runs(self.root) - keep - {self.run_id})
        for run_id in gone:
            remove_pool(self.root / run_id)
        return gone

    def node_paths(self) -> NodePaths:
        """The workers run on this machine: the scripts version's trainer, the data and results folders as they are."""
        return NodePaths(str(self.run.scripts), str(self.run.data), str(self.run.out))

    def job(self, program: Program, timeout_s: float = 0) -> "ProcessJob":
        return ProcessJob(self, program)


def remove_pool(folder: Path) -> None:
    """Stop the launchers a process pool's folder records (their process groups), then remove the folder."""
    pids = folder / "pids"
    for line in pids.read_text().split() if pids.exists() else []:
        try:
            os.killpg(int(line), signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    shutil.rmtree(folder, ignore_errors=True)


def leftover_runs(root: Path) -> set[str]:
    """Run ids of process pools under `root` whose owning process is gone."""
    found = set()
    for marker in root.glob(f"*/{MARKER}") if root.exists() else []:
        if not owner_alive(json.loads(marker.read_text()).get("owner", "")):
            found.add(marker.parent.name)
    return found


@dataclass
class ProcessJob(OneAttempt):
    """The launcher as a local process group on a process pool; the program's preflight runs first."""

    pool: ProcessPool
    program: Program
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def command(self) -> list[str]:
        """torchrun or horovodrun starting the program's workers as local processes."""
        program = self.program
        return local_command(program.launcher, program.workers, program.rank_argv(self.pool.node_paths()))

    @property
    def environment(self) -> dict[str, str]:
        """The variables the program gives every rank."""
        return self.program.environment(self.pool.node_paths())

    def describe(self) -> str:
        names = sorted(self.environment)
        return " ".join(self.command) + (f" (sets {', '.join(names)})" if names else "")

    def check(self) -> None:
        if not Path(self.command[0]).exists():
            raise LaunchError(
                f"{self.command[0]} is missing; run `make setup-horovod` to install Horovod", permanent=True
            )
        self.program.preflight(self.pool.node_paths())

    def submit(self) -> None:
        env = {**os.environ, **self.environment}
        self.proc = spawn(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env)
        self.pool.record_process(self.proc.pid)

    @property
    def launcher(self) -> subprocess.Popen:
        """The launcher's process (the job was submitted)."""
        if self.proc is None:
            raise LaunchError("the job was not submitted", permanent=True)
        return self.proc

    def lines(self) -> Iterator[str]:
        return iter(self.launcher.stdout or ())

    def poll(self) -> int | None:
        return self.launcher.poll()

    def cancel(self) -> None:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.launcher.pid, sig)
                self.launcher.wait(timeout=wait)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue


def train_here(training: TrainingSettings, data: str, out: Path, pools: Path, echo: Callable[[str], None]) -> Metrics:
    """`training` on a process pool of this machine with this checkout's trainer (`trainflow train`, the
    benchmarks); the run's metrics. An `out` that holds checkpoints is resumed."""
    if problem := missing_part(training):  # the workers train in this venv
        raise BadInput(problem)
    run = RunPaths(out.name, Path(data), PACKAGE.parent, out)
    return train_on_pool(ProcessPool(training.workers, run, pools), training, out, echo)


class ProcessBackend(LocalBackend[ProcessPoolConfig]):
    """Local worker processes on this machine."""

    name = "process"
    settings = ProcessPoolConfig

    def nodes(self, pool: ProcessPoolConfig) -> int:
        return 1

    def check_world(self, pool: ProcessPoolConfig, training: TrainingSettings) -> None:
        """Up to the pool's slots, and no more workers than GPUs where they train on GPUs (NCCL: one rank a GPU)."""
        super().check_world(pool, training)
        if problem := shared_gpu(training.workers, getattr(training, "device", "auto")):
            raise ValueError(problem)

    def pool(self, cfg: RunConfig[ProcessPoolConfig], run: RunPaths, image: str | None) -> ProcessPool:
        return ProcessPool(cfg.pool.slots_per_node, run, cfg.workdir / "pools")
