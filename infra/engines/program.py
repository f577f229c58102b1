"""The program a run executes on the pool: trainflow's own trainer (a framework's `TrainingSettings`) or a user's
script (`ScriptProgram`, infra/engines/script.py). The pools, the jobs and the steps read this interface and never
ask which one runs: what ships (the scripts step), how each rank is called and what it is given (the job), and
what it promises back (the results step: the trainer's metrics.json and model file, or a script's exit status,
files and the metrics read from its lines)."""

from pathlib import Path
from typing import Any, Protocol


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

    def rank_argv(self, data: str, out: str, scripts: str) -> list[str]:
        """What each rank runs after the interpreter, given where the data, the results and the scripts version are
        as the ranks see them."""
        ...

    def environment(self, data: str, out: str, scripts: str) -> dict[str, str]:
        """The variables every rank gets beyond the launcher's."""
        ...

    def preflight(self, data: str, out: Path, scripts: str) -> None:
        """Its checks (and set-up) before any rank starts; BadInput naming what is wrong."""
        ...

    def describe(self) -> dict[str, Any]:
        """What it runs, in a few fields."""
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
