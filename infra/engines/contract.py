"""The trainer's contract: what the orchestrator knows of any framework's trainer, and what every trainer keeps.

- Its settings. Each framework's section (`TrainingSettings` and the fields its engine module adds) holds the
  orchestrator's own settings (framework, launcher, workers, preflight) and the trainer's options, with the
  trainer's defaults, choices, help and checks.
- Its command line: `python <scripts>/<ENTRY> --data D --out O <options>` (`trainer_argv`), and its preflight:
  the same with `--check` in one process, before any worker (`preflight`).
- Its output, one format for every framework, so that progress, tracking, the ledger and the reports never ask
  which framework trained: every line starts with `[rank N]`, an input error is `... ERROR error: MESSAGE`, the
  progress line every training.log_every steps is `PROGRESS_LINE` (tasks/progress.py shows it live), a checkpoint
  written is `checkpoint step N saved` and a resume `resumed from step-N.<ext>` (`CHECKPOINT_LINE`: what a
  resubmitting backend counts lost work from), and rank 0 writes metrics.json (`TrainingMetrics`) and the model
  (`MODEL_FILE`).

Of the trainer package, the orchestrator imports only its contract modules (trainer.errors, trainer.layout and
its image_files, verified and folders, trainer.scripts, trainer.staged, trainer.tracking, trainer.jpeg_crop) and,
in each engine module, that framework's options; the trainer never imports the orchestrator (both are
import-linter contracts in pyproject.toml).
"""

import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.core.errors import BadInput
from trainer.layout import SYNTHETIC

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "containers" / "trainer"  # the training package: every framework's trainer, uploaded as one
RANK_LINE = re.compile(r"\[rank (\d+)\]")
ERROR_LINE = re.compile(r"\[rank (\d+)\].* ERROR error: (.*)")
# The progress line, every training.log_every steps: epoch, global step, (step in epoch/steps per epoch), images/s.
PROGRESS_LINE = re.compile(r"epoch (\d+) step (\d+) \((\d+)/(\d+)\) loss \S+ lr \S+, ([\d.]+) images/s")
CHECKPOINT_LINE = re.compile(r"checkpoint step (\d+) saved|resumed from step-(\d+)\.")

__all__ = [
    "SYNTHETIC",
    "TrainingSettings",
    "TrainingMetrics",
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
    """Training processes (the world size)."""
    preflight_images: bool = True
    """The preflight (process pool and `trainflow train`) decodes every image once before the workers start,
    so a corrupt file fails fast, by name; the other checks always run."""

    if TYPE_CHECKING:  # an engine adds its trainer's options as fields made from the trainer's own parser, which
        # the type checker cannot see: to it, they are Any

        def __getattr__(self, name: str) -> Any: ...

    def trainer_args(self) -> list[str]:
        """The trainer's command-line options for these settings (the orchestrator's own settings excluded)."""
        raise NotImplementedError


class TrainingMetrics(BaseModel):
    """metrics.json as rank 0 writes it (the fields the orchestrator reads; the others are kept as they are)."""

    model_config = ConfigDict(extra="allow")

    status: Literal["running", "complete", "interrupted", "failed"]  # the last two: set by infra/runs/record.py
    framework: str = "pytorch"
    """The framework that trained (training.framework); metrics.json of runs before it was recorded: pytorch."""
    model: str
    world_size: int
    backend: str
    images_per_sec: float | None = None
    data_wait_share: list[float] | None = None
    """Per rank: the share of the last epoch's training time spent waiting for the next batch (the loader) rather
    than computing; high on any rank means the loader underfeeds the GPUs (each epoch's row has its own)."""
    steady_images_per_sec: float | None = None
    """The last epoch's images/s after its first step (which also infers shapes and allocates): what benches use."""
    cpu_ms_per_step: dict[str, float | None] = {}
    """The last epoch's CPU ms per step after its first, mean of the ranks: "training_thread" (the thread that runs
    the step) and "other_threads" (the all-reduce's threads; with more than one torch thread, its pool too)."""
    wall_seconds: float
    final_val_top1: float | None = None
    final_val_top5: float | None = None
    trainer: str = ""
    """The training package that ran (which scripts version trained the model)."""
    epochs: list[dict] = []
    peak_memory_mb: list[float] = []
    """Per rank: peak memory (allocated on CUDA, the process's own peak resident set on the CPU)."""
    training_memory_mb: list[float] = []
    """Per rank: the part of the peak that the model and its training added (on the CPU: above the resident set
    before the model was built; on CUDA the same as peak_memory_mb)."""
    pipeline: dict | None = None
    bad_files: dict | None = None
    """Images the run left out because they cannot be decoded (training.bad_files: skip): {"count": N, "list":
    path of the list file (TSV `path<TAB>reason`, in the results), "first": [[path, reason], ...] (up to 20)}."""


def read_metrics(out: Path) -> TrainingMetrics:
    """The run's metrics.json."""
    return TrainingMetrics.model_validate_json((out / "metrics.json").read_text())


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
        errors = [m.group(2) for m in map(ERROR_LINE.search, proc.stdout.splitlines()) if m]
        raise BadInput(errors[-1] if errors else f"training check failed:\n{proc.stdout}{proc.stderr}")
