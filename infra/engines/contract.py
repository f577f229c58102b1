"""The trainer's contract: everything the orchestrator knows about containers/trainer/train.py.

- Its options. `TrainingConfig` is made from the trainer's own argument parser (trainer/options.py):
  every option is a setting with the trainer's default, choices and help, and the trainer's own checks
  (`check_args`, `check_layout`) validate it. Two settings are the orchestrator's: the launcher and
  the number of workers; `preflight_images` says whether the preflight decodes every image.
- Its command line (`trainer_argv`) and its preflight (`train.py --check`, one process, before any worker).
- Its output: every line starts with `[rank N]`, an input error is `... ERROR error: MESSAGE`, the progress
  line every training.log_every steps is `PROGRESS_LINE` (tasks/progress.py shows it live), and rank 0
  writes metrics.json (`TrainingMetrics`).

The trainer never imports this module or anything else of the orchestrator.
"""

import argparse
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from infra.core.errors import BadInput
from trainer.errors import UsageError
from trainer.options import SYNTHETIC, build_parser, check_args, check_layout

REPO = Path(__file__).resolve().parents[2]
TRAINER = "trainer/train.py"  # the entry point inside the training package (a scripts version, an image)
RANK_LINE = re.compile(r"\[rank (\d+)\]")
ERROR_LINE = re.compile(r"\[rank (\d+)\].* ERROR error: (.*)")
# The progress line, every training.log_every steps: epoch, global step, (step in epoch/steps per epoch), images/s.
PROGRESS_LINE = re.compile(r"epoch (\d+) step (\d+) \((\d+)/(\d+)\) loss \S+ lr \S+, ([\d.]+) images/s")
# Set by the flow for each run, or the preflight's own: not settings.
PER_RUN = {"help", "data", "out", "check", "check_workers"}
FLAG = re.compile(r"--([a-z][a-z-]*)")

__all__ = [
    "SYNTHETIC",
    "TrainingConfig",
    "TrainingMetrics",
    "trainer_argv",
    "check_command",
    "preflight",
    "read_metrics",
    "trainer_script",
]


class LauncherSettings(BaseModel):
    """The orchestrator's own settings of a training run; the trainer's options are added from its parser."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    launcher: Literal["torchrun", "horovodrun"] = "torchrun"
    """torchrun (torch.distributed) or horovodrun (Horovod over Gloo locally, MPI/NCCL on GPU nodes)."""
    workers: int = Field(2, ge=1)
    """Training processes (the world size)."""
    preflight_images: bool = True
    """The preflight (process pool and `trainflow train`) decodes every image once before the workers start,
    so a corrupt file fails fast, by name; the other checks always run."""

    @model_validator(mode="after")
    def _the_trainer_accepts_it(self) -> "LauncherSettings":
        args = self.namespace()
        if self.launcher == "horovodrun" and args.backend == "auto":
            args.backend = "horovod"
        try:
            check_args(args)
            if self.parallel == "pipeline":
                check_layout(self.workers, self.stages, self.batch_size, self.microbatches)
        except UsageError as exc:
            raise ValueError(setting_names(str(exc))) from None
        return self

    def namespace(self) -> Namespace:
        """These settings as the trainer's parsed arguments."""
        return Namespace(**self.model_dump(exclude=set(LauncherSettings.model_fields)))

    def trainer_args(self) -> list[str]:
        """The trainer's command-line options for these settings (launcher and workers excluded)."""
        args = []
        for name, value in vars(self.namespace()).items():
            flag = "--" + name.replace("_", "-")
            if value == "":  # unset (--tracking-uri): the trainer's default
                continue
            if isinstance(value, bool):
                args.append(flag if value else f"--no-{flag[2:]}")
            else:
                args += [flag, str(value)]
        return args


def setting_names(message: str) -> str:
    """A trainer message with its option names (--batch-size) as the config's (training.batch_size); the world
    size is training.workers."""
    message = message.replace("the world size", "training.workers")
    return FLAG.sub(lambda m: "training." + m.group(1).replace("-", "_"), message)


def option_fields(parser: argparse.ArgumentParser) -> dict[str, tuple]:
    """(type, Field) of every trainer option that is a setting: its default, its choices, its help."""
    fields = {}
    for action in parser._actions:
        if action.dest in PER_RUN:
            continue
        if action.choices:
            kind = Literal[tuple(action.choices)]
        elif isinstance(action, argparse.BooleanOptionalAction):
            kind = bool
        else:
            kind = action.type or str
        fields[action.dest] = (kind, Field(action.default, description=action.help))
    return fields


TrainingConfig = create_model(
    "TrainingConfig", __base__=LauncherSettings, __module__=__name__, **option_fields(build_parser())
)
TrainingConfig.__doc__ = (
    "How the trainer runs: the launcher, the workers, and every option of train.py "
    "(`python containers/trainer/train.py --help`), with its defaults: the ResNet-50-on-ImageNet "
    "reference case."
)


class TrainingMetrics(BaseModel):
    """metrics.json as rank 0 writes it (the fields the orchestrator reads; the others are kept as they are)."""

    model_config = ConfigDict(extra="allow")

    status: Literal["running", "complete", "interrupted", "failed"]  # the last two: set by infra/runs/record.py
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


def trainer_script() -> Path:
    """The trainer's entry point in this checkout."""
    return REPO / "containers" / TRAINER


def trainer_argv(cfg: LauncherSettings, data: str, out: Path | str, script: str | None = None) -> list[str]:
    """The trainer script (this checkout's, or `script` where the workers see it) and its arguments."""
    return [script or str(trainer_script()), "--data", data, "--out", str(out), *cfg.trainer_args()]


def check_command(
    cfg: LauncherSettings, data: str, out: Path | str, python: str = sys.executable, script: str | None = None
) -> list[str]:
    """One process that checks the arguments, output folder, data and model before any worker starts."""
    decode = ["--verify-images"] if cfg.preflight_images else []
    return [python, *trainer_argv(cfg, data, out, script), "--check", "--check-workers", str(cfg.workers), *decode]


def preflight(cfg: LauncherSettings, data: str, out: Path, script: str | None = None) -> None:
    """Run the trainer's own checks in one process; raise BadInput with its one-line message."""
    proc = subprocess.run(check_command(cfg, data, out, script=script), capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [m.group(2) for m in map(ERROR_LINE.search, proc.stdout.splitlines()) if m]
        raise BadInput(errors[-1] if errors else f"training check failed:\n{proc.stdout}{proc.stderr}")
