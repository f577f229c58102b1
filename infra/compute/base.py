"""What every compute backend provides (`Backend`), what it reads of the config (`PoolSection`, `RunConfig`),
and the code that runs a job on any of them.

A `Pool` is created, waited for, described and deleted, and makes the run's `Job`; a job is checked,
submitted, streamed, polled and cancelled, describes its command (which the dry run prints), and lists
the attempts it made itself (a backend that resubmits after a pre-emption; [] where the Prefect task's
retry is the only one).
"""

import os
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from queue import Queue
from typing import Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from infra.compute.silence import watched
from infra.core.errors import TrainflowError
from infra.engines import TrainingConfig
from infra.engines.contract import SYNTHETIC, Metrics, TrainingSettings, read_metrics
from infra.engines.gpus import auto_count
from infra.engines.launchers import LaunchError, route_output
from infra.engines.program import Program
from infra.images.registry import ImageConfig
from infra.storage.fileshare import FileShareConfig, local_root
from nodelib.records import Event


class PoolError(TrainflowError):
    """A pool could not be created or used."""


class JobTimedOut(LaunchError):
    """The job ran past job.timeout_s and was stopped; another attempt would too, so it is not retried."""

    permanent = True


class JobConfig(BaseModel):
    """How long a training job may run."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    timeout_s: float = Field(172800, ge=0)
    """Seconds before the job is stopped and fails (0: no limit). ResNet-50 on ImageNet takes about a day on 8 GPUs."""
    silent_s: float = Field(0, ge=0)
    """Seconds with no line from any rank after which the job is stopped as hung, naming when each rank last printed;
    with it set, Horovod's stall warning stops it too (0: never)."""


@dataclass(frozen=True)
class RunPaths:
    """A run's folders as this machine sees them: the file server's data set version (or synthetic), the
    scripts version on the file share (scripts/<version>), the run's results; and the run's id and data set."""

    run_id: str
    data: Path
    scripts: Path
    out: Path
    dataset: str = ""

    @property
    def synthetic(self) -> bool:
        """Whether the trainer generates its data (nothing to mount)."""
        return str(self.data) == SYNTHETIC


class Job(Protocol):
    """The one interface every backend's job has."""

    def describe(self) -> str: ...

    def check(self) -> None: ...

    def submit(self) -> None: ...

    def lines(self) -> Iterator[str]: ...

    def poll(self) -> int | None: ...

    def cancel(self) -> None: ...

    def attempts(self) -> list[dict]: ...


class Pool(Protocol):
    """The one interface every backend's pool has."""

    @property
    def run_id(self) -> str: ...

    def create(self) -> None: ...

    def wait_until_ready(self) -> None: ...

    def describe(self) -> dict: ...

    def delete(self) -> None: ...

    def delete_leftovers(self, keep: set[str]) -> list[str]: ...

    def job(self, program: Program, timeout_s: float) -> Job: ...


class PoolSection(BaseModel):
    """What every backend's pool section has; each backend's own section adds its settings (PoolConfig in
    infra/compute/__init__.py is the union of them, picked by `backend`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    backend: str
    """process: local worker processes; docker: one container per node from the training image;
    azureml: an Azure ML compute cluster."""
    nodes: int = Field(1, ge=1)
    """Nodes in the pool (the process pool is always this one machine)."""
    slots_per_node: int = Field(2, ge=1)
    """Workers one node runs at most (azureml: GPUs per node, the processes each node starts); auto: this machine's
    visible GPUs, else its usable cores (the process and docker pools)."""

    @field_validator("slots_per_node", mode="before")
    @classmethod
    def _auto_slots(cls, value: object) -> object:
        return cls.auto_slots(value)

    @classmethod
    def auto_slots(cls, value: object) -> object:
        """`auto` as this machine's count (its nodes are this machine's processes or containers)."""
        return auto_count(value)


S = TypeVar("S", bound=PoolSection)
S_co = TypeVar("S_co", bound=PoolSection, covariant=True)
Billing = tuple[str | None, bool, int]  # VM size (None: this machine), low-priority, most attempts of a training job
SyncWhere = Literal["here", "pool", "nodes"]


class RunConfig(Protocol[S_co]):
    """What the backends read of a run's config, with the pool section of type S_co (flows/config.py's
    FlowConfig has it all; infra does not import flows)."""

    @property
    def workdir(self) -> Path: ...

    @property
    def data(self) -> str | None: ...

    @property
    def pool(self) -> S_co: ...

    @property
    def training(self) -> TrainingConfig: ...

    @property
    def fileshare(self) -> FileShareConfig: ...

    @property
    def image(self) -> ImageConfig: ...

    @property
    def job(self) -> JobConfig: ...


class Backend(Protocol[S]):
    """A compute backend: one module in this package, registered in `infra/compute/__init__.py`, that owns its
    pool section (S), its pool, its job, and where the trainer, the scripts and the data are on its nodes."""

    name: str
    """pool.backend in the config."""
    needs_image: bool
    """Its nodes run the pushed training image."""
    reads_local_files: bool
    """Its workers read this machine's files at their paths (training.init_from's model file)."""
    settings: type[S]
    """Its pool section: the settings under `pool:` when pool.backend names it."""

    def check(self, cfg: RunConfig[S]) -> None:
        """Refuse a config it cannot run (a ValueError naming the settings), the world size included (check_world):
        every command validates its config once, so each rule runs once."""

    def check_world(self, pool: S, training: TrainingSettings) -> None:
        """Refuse a world size (training.workers, its one owner) that the pool cannot start: the backend's rule."""

    def nodes(self, pool: S) -> int:
        """Nodes the pool has."""

    def billing(self, pool: S) -> Billing:
        """What infra/runs/ledger.py prices: the VM size of its nodes (None: this machine), low-priority, and the
        most attempts a training job makes."""

    def scripts_root(self, workdir: Path) -> Path:
        """Where its nodes find the file share's scripts/<version>."""

    def sync_where(self, pool: S) -> SyncWhere:
        """Who syncs Blob to the file server: "here" (the flow), "pool" (a job on the pool: its pool's sync_job()),
        "nodes" (each node, as the job starts)."""

    def pool(self, cfg: RunConfig[S], run: RunPaths, image: str | None) -> Pool:
        """This run's pool, not yet created."""

    def specs(self, cfg: RunConfig[S], run: RunPaths, image: str | None, program: Program) -> dict[str, str]:
        """What it would send a service to run `program`, for the dry run (as YAML; nothing for the local pools)."""


class LocalBackend(Generic[S]):
    """What the backends on this machine share: they read the local file share, and send no service a spec."""

    name: str
    needs_image = False
    reads_local_files = True

    def check(self, cfg: RunConfig[S]) -> None:
        if cfg.fileshare.backend != "local":
            raise ValueError(
                f"the {self.name} pool runs the scripts from the local file share, but fileshare.backend "
                "is azure; set fileshare.backend: local to train on this machine"
            )
        self.check_world(cfg.pool, cfg.training)

    def check_world(self, pool: S, training: TrainingSettings) -> None:
        """Up to the pool's slots, one worker a slot."""
        slots = self.nodes(pool) * pool.slots_per_node
        if training.workers > slots:
            raise ValueError(
                f"training.workers is {training.workers} but the {self.name} pool has {slots} slots "
                f"({self.nodes(pool)} node(s) x pool.slots_per_node {pool.slots_per_node}); "
                "lower training.workers or raise pool.nodes / pool.slots_per_node"
            )

    def nodes(self, pool: S) -> int:
        return pool.nodes

    def billing(self, pool: S) -> Billing:
        """This machine (priced as cost.this_machine); a job makes one attempt and run-training retries it once."""
        return None, False, 2

    def scripts_root(self, workdir: Path) -> Path:
        return local_root(workdir)

    def sync_where(self, pool: S) -> SyncWhere:
        """The file server is a folder of this machine: the flow syncs it."""
        return "here"

    def specs(self, cfg: RunConfig[S], run: RunPaths, image: str | None, program: Program) -> dict[str, str]:
        return {}


class OneAttempt:
    """A job that makes one attempt: a retry is the Prefect task's, which resumes from the checkpoints."""

    def attempts(self) -> list[dict]:
        return []


def owner() -> str:
    """This process, as host:pid: what a pool records, so a later run can tell a crashed run's pool."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(label: str) -> bool:
    """Whether the process named by an owner label still runs (owners on other hosts are assumed alive)."""
    host, _, pid = label.rpartition(":")
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
        return True
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True


def run_job(
    job: Job,
    log_dir: Path,
    echo: Callable[[str], None],
    timeout_s: float,
    on_event: Callable[[Event], None] = lambda event: None,
    silent_s: float = 0,
) -> int:
    """Check and submit `job`, stream its output into log_dir, its log lines to `echo` and the trainer's events to
    `on_event`, and wait; cancel it past `timeout_s`, or once silent for `silent_s` (0: never)."""
    job.check()
    job.submit()
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        job.cancel()

    timer = threading.Timer(timeout_s, expire) if timeout_s else None
    if timer:
        timer.daemon = True
        timer.start()
    silence = watched(silent_s, job.cancel)
    lines = silence.lines(job.lines()) if silence else job.lines()
    try:
        return route_output(lines, lambda: wait_for(job), log_dir, echo, on_event)
    except LaunchError as exc:
        if timed_out.is_set():
            raise JobTimedOut(
                f"the job ran past its timeout of {timeout_s:g} s and was stopped; "
                f"raise job.timeout_s or train for less. {exc}"
            ) from None
        if silence and silence.why:
            raise silence.error(exc) from None
        raise
    except BaseException:  # cancelled (Prefect cancellation, Ctrl-C): stop the workers too
        job.cancel()
        raise
    finally:
        if timer:
            timer.cancel()
        if silence:
            silence.done.set()


def train_on_pool(pool: Pool, training, out: Path, echo: Callable[[str], None], timeout_s: float = 0) -> Metrics:
    """Create the pool, run the training job on it, and delete it whatever happens; the run's metrics. A run that
    fails leaves no empty folder of its own making where its results would be."""
    created = first_missing(out)
    try:
        pool.create()
        pool.wait_until_ready()
        run_job(pool.job(training, timeout_s), out / "logs", echo, timeout_s)
    except BaseException:
        if created:
            remove_if_empty(created)
        raise
    finally:
        pool.delete()
    return read_metrics(out)


def first_missing(path: Path) -> Path | None:
    """The highest folder of `path` that does not exist yet (None when it exists): where a run's creating begins."""
    missing = None
    for folder in [path, *path.parents]:
        if os.path.lexists(folder):
            return missing
        missing = folder
    return missing


def remove_if_empty(folder: Path) -> None:
    """Remove `folder` if it holds no file, only (nested) empty folders."""
    if folder.is_dir() and not any(not p.is_dir() or p.is_symlink() for p in folder.rglob("*")):
        shutil.rmtree(folder, ignore_errors=True)


def wait_for(job: Job, interval: float = 0.2) -> int:
    """Poll until the job ends; its exit status."""
    while (status := job.poll()) is None:
        threading.Event().wait(interval)
    return status


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
