"""The program a run executes on the pool: trainflow's own trainer (a framework's `TrainingSettings`) or a user's
script (`ScriptProgram`, infra/engines/script.py). The pools, the jobs and the steps read this interface and never
ask which one runs: what ships (the scripts step), how each rank is called and what it is given (the job), and
what it promises back (the results step: the trainer's metrics.json and model file, or a script's exit status,
files and the metrics read from its lines)."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nodelib.cores import usable_cores

# trainflow's node-side code (trainer/, scriptrun/) where the ranks run on this machine: this checkout's containers/
RUNTIME = str(Path(__file__).resolve().parents[2] / "containers")
IMAGE_RUNTIME = "/opt/trainflow"  # and where the training images hold it (containers/*.Dockerfile)


@dataclass(frozen=True)
class NodePaths:
    """Where a pool's ranks find the scripts version (for the built-in trainer, the folder that holds trainer/), the
    data and the results folder; trainflow's node-side code (scriptrun/: this checkout's containers/, or the image's
    /opt/trainflow); how many nodes they run on; and whether the program's preflight ran for them on this machine
    (the process pool) or not (container and cloud nodes, which check on the nodes); the cores each node has (None:
    not known here); and whether the run's folders under `out` are made before the launch (False: the nodes make
    them, where `out` exists only there: an Azure ML job's output)."""

    scripts: str
    data: str
    out: str
    runtime: str = RUNTIME
    nodes: int = 1
    checked: bool = True
    cores: int | None = field(default_factory=usable_cores)
    prepared: bool = True


class Program(Protocol):
    """What a pool's job runs on every rank, and how."""

    @property
    def framework(self) -> str: ...

    @property
    def launcher(self) -> str: ...

    @property
    def workers(self) -> int: ...

    @property
    def epochs(self) -> int:
        """The epochs its progress counts to (a script's progress is not counted in epochs: 1)."""
        ...

    def at_attempt(self, attempt: int) -> "Program":
        """The program for attempt `attempt` of its run."""
        ...

    def rank_argv(self, at: NodePaths) -> list[str]:
        """What each rank runs after the interpreter, given where the data, the results, the scripts version and
        trainflow's node-side code are as the ranks see them."""
        ...

    def environment(self, at: NodePaths) -> dict[str, str]:
        """The variables every rank gets beyond the launcher's."""
        ...

    def preflight(self, here: NodePaths) -> None:
        """Its checks (and set-up) on this machine before any rank starts here; BadInput naming what is wrong."""
        ...

    def prepare(self, here: NodePaths) -> list[str]:
        """The set-up on this machine (`here`: its folders) for ranks that run in an image, not in this environment:
        the requirements their environment must meet (the pool checks them on a node); BadInput naming what is
        wrong."""
        ...

    def describe(self) -> dict[str, Any]:
        """What it runs, in a few fields."""
        ...

    @property
    def secret_variables(self) -> set[str]:
        """The variables of `environment` whose values are the user's own (a token, say): a dry run shows their
        names, never their values."""
        ...

    def outcome(self, out: Path) -> dict[str, Any]:
        """What the finished run gave back, read from its results folder `out`: the summary the report, the ledger,
        the receipt and MLflow read."""
        ...

    def metrics_in(self, line: str) -> dict[str, float]:
        """The metrics a line of the job's stream carries, as they come (the live progress); {} for none."""
        ...

    def to_blob(self, out: Path) -> list[str]:
        """The files of its results folder `out` that also go to Blob (relative): the model, a script's outputs."""
        ...

    @property
    def MODEL_FILE(self) -> str | None:
        """The model file it writes into the results folder (None: none of a known name)."""
        ...
