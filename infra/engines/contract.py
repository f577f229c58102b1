"""The trainer's contract: what the orchestrator knows of any framework's trainer, and what every trainer keeps.

- Its settings. Each framework's section (`TrainingSettings` and the fields its engine module adds) holds the
  orchestrator's own settings (framework, launcher, workers, preflight) and the trainer's options, with the
  trainer's defaults, choices, help and checks.
- Its command line: `python <scripts>/<ENTRY> --data D --out O <options>` (`trainer_argv`), and its preflight:
  the same with `--check` in one process, before any worker (`preflight`).
- Its output, one format for every framework, declared once in nodelib/records.py (which both sides import), so
  that progress, tracking, the ledger and the reports never ask which framework trained: every line starts with
  `[rank N]`; events beside the log for people (`Progress` every training.log_every steps, which tasks/progress.py
  shows live; `Checkpointed`, what a resubmitting backend counts lost work from; `Failure`, an input error's one
  line); rank 0 writes metrics.json (records.Metrics) and the model (`MODEL_FILE`).

Of the trainer package, the orchestrator imports only its contract modules (nodelib.errors, nodelib.layout and
its image_files, verified and folders, nodelib.scripts, nodelib.staged, trainer.tracking, trainer.jpeg_crop) and,
in each engine module, that framework's options; the trainer never imports the orchestrator (both are
import-linter contracts in pyproject.toml).
"""

import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from infra.core.errors import BadInput
from infra.engines.gpus import auto_count
from infra.engines.program import NodePaths
from nodelib.layout import SYNTHETIC
from nodelib.records import SCHEMA, Failure, Metrics, read_event

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "containers" / "trainer"  # the training package: every framework's trainer, uploaded as one
NODELIB = REPO / "containers" / "nodelib"  # the node-side library it runs on, uploaded with it
METRICS = TypeAdapter(Metrics)  # metrics.json: the trainer's declaration, validated here by pydantic

__all__ = [
    "SYNTHETIC",
    "TrainingSettings",
    "Metrics",
    "METRICS",
    "metrics_from",
    "trainer_argv",
    "check_command",
    "preflight",
    "read_metrics",
]


class TrainingSettings(BaseModel):
    """The settings of a training run that the orchestrator owns, whatever the framework; each engine module
    adds its trainer's options (and says where its trainer starts, ENTRY, and which launchers start it)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    ENTRY: ClassVar[str]
    """The trainer's entry point inside the training package (a scripts version, an image), e.g. trainer/train.py."""
    MODEL_FILE: ClassVar[str]
    """The trained model that rank 0 writes into the results folder (model.pt, model.keras): the flow puts it in Blob
    and in the MLflow run."""
    IMAGE_STACK: ClassVar[str]
    """The prefix of its images' Dockerfiles and repositories: "" (containers/cpu.Dockerfile, trainflow-cpu) or
    "tf-" (containers/tf-cpu.Dockerfile, trainflow-tf-cpu): one image per framework's libraries."""
    LAYERS: ClassVar[tuple[str, ...]] = ()
    """The install layers its trainer needs beyond the base one when it trains on this machine's processes
    (infra/engines/installed.py): none for PyTorch, ("tensorflow",) for TensorFlow and Keras."""

    framework: str
    """The training framework (an engine of infra/engines)."""
    launcher: Literal["torchrun", "horovodrun"] = "torchrun"
    """torchrun (torch.distributed) or horovodrun (Horovod over Gloo locally, MPI/NCCL on GPU nodes)."""
    workers: int = Field(2, ge=1)
    """Training processes (the world size); auto: one per visible GPU, else one per usable core."""
    preflight_images: bool = True
    """The preflight (process pool and `trainflow train`) decodes every image once before the workers start,
    so a corrupt file fails fast, by name; the other checks always run."""

    @field_validator("workers", mode="before")
    @classmethod
    def _auto_workers(cls, value: object) -> object:
        return auto_count(value)  # `auto` counted on this machine, where the process pool's workers run

    def trainer_args(self) -> list[str]:
        """The trainer's command-line options for these settings (the orchestrator's own settings excluded)."""
        raise NotImplementedError

    # The program a run executes (infra/engines/program.py): here trainflow's own trainer.
    def at_attempt(self, attempt: int) -> Self:
        """The program for an attempt of its run: the trainer resumes from its checkpoints on its own."""
        return self

    def rank_argv(self, at: NodePaths) -> list[str]:
        """What each rank runs after the interpreter: the trainer with its options; where the preflight checked
        everything first (`at.checked`), its images decoded once by the preflight already."""
        workers = self.model_copy(update={"verify_images": False}) if self.preflight_images and at.checked else self
        return trainer_argv(workers, at.data, at.out, at.scripts)

    def environment(self, at: NodePaths) -> dict[str, str]:
        """Every rank's variables beyond the launcher's: none (the trainer takes its options)."""
        return {}

    def preflight(self, here: NodePaths) -> None:
        """The trainer's own checks in one process, before any worker."""
        preflight(self, here.data, Path(here.out), here.scripts)

    def prepare(self, here: NodePaths) -> list[str]:
        """Nothing on this machine: the trainer checks its input on the nodes, where the data is; its image holds
        everything it needs."""
        return []

    def describe(self) -> dict[str, Any]:
        """What the run executes: the trainer and its model."""
        return {"entry": self.ENTRY, "model": getattr(self, "model", "")}

    @property
    def secret_variables(self) -> set[str]:
        """None: the trainer's ranks get no variables of the user's."""
        return set()

    def outcome(self, out: Path) -> dict[str, Any]:
        """What the finished trainer gave back: its metrics.json."""
        return read_metrics(out).to_json()

    def metrics_in(self, line: str) -> dict[str, float]:
        """None: the trainer's progress comes as its events."""
        return {}

    def to_blob(self, out: Path) -> list[str]:
        """The model goes to Blob too."""
        return [self.MODEL_FILE]


def read_metrics(out: Path) -> Metrics:
    """The run's metrics.json, checked against the trainer's declaration."""
    return metrics_from(METRICS.validate_json, (out / "metrics.json").read_bytes(), out / "metrics.json")


def metrics_from(validate, value, where: Path | str) -> Metrics:
    """`validate(value)` (METRICS.validate_json or validate_python): metrics.json of a known schema, or BadInput
    naming what is wrong with it."""
    try:
        metrics = validate(value)
    except ValidationError as exc:
        problem = exc.errors()[0]
        at = ".".join(map(str, problem["loc"])) or "the file"
        raise BadInput(f"{where} is not a trainer's metrics.json ({at}: {problem['msg']})") from None
    if metrics.schema > SCHEMA:
        raise BadInput(
            f"{where} has schema {metrics.schema}, newer than this trainflow's {SCHEMA}: upgrade trainflow to read it"
        )
    return metrics


def trainer_argv(
    training: TrainingSettings, data: str, out: Path | str, scripts: str | Path = PACKAGE.parent
) -> list[str]:
    """The trainer's entry point under `scripts` (the folder that holds trainer/: this checkout's, or where the
    workers see the scripts version) and its arguments."""
    return [f"{scripts}/{training.ENTRY}", "--data", data, "--out", str(out), *training.trainer_args()]


def check_command(
    training: TrainingSettings,
    data: str,
    out: Path | str,
    python: str = sys.executable,
    scripts: str | Path = PACKAGE.parent,
) -> list[str]:
    """One process that checks the arguments, output folder, data and model before any worker starts."""
    decode = ["--verify-images"] if training.preflight_images else []
    argv = trainer_argv(training, data, out, scripts)
    return [python, *argv, "--check", "--check-workers", str(training.workers), *decode]


def preflight(training: TrainingSettings, data: str, out: Path, scripts: str | Path = PACKAGE.parent) -> None:
    """Run the trainer's own checks in one process; raise BadInput with its one-line message."""
    proc = subprocess.run(check_command(training, data, out, scripts=scripts), capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [e.message for e in map(read_event, proc.stdout.splitlines()) if isinstance(e, Failure)]
        raise BadInput(errors[-1] if errors else f"training check failed:\n{proc.stdout}{proc.stderr}")
