"""The contract between every framework's trainer and the orchestrator, as typed records both sides import. The
standard library only: it ships to the nodes with the trainer, and the orchestrator reads what a trainer wrote
through these same declarations (no log line is parsed by a pattern anywhere else).

- Every line a trainer prints starts with its rank, `[rank N] ` (`rank_prefix`, `line_rank`): the launchers give
  each rank its own log by it.
- Beside its log for people, a trainer writes events: one JSON object per line after `EVENT_MARK` (`event_line`,
  `read_event`). `Progress` every --log-every steps (the live progress, the Azure ML attempt's last step),
  `Checkpointed` when a checkpoint is written or resumed from (what a resubmitted attempt lost), `Failure` when it
  stops on an error (bad input: that one line, then exit status 2; a fault or an unexpected error: exit status 1).
- Rank 0 writes metrics.json: `Metrics`, rewritten after each epoch, one `EpochRow` per epoch. `SCHEMA` is its
  version: a reader refuses a newer one than it knows.
"""

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA = 1
EVENT_MARK = "@trainflow "
RANK_OPEN = "[rank "


def rank_prefix(rank: int) -> str:
    """What every line of rank `rank` starts with."""
    return f"{RANK_OPEN}{rank}] "


def line_rank(line: str) -> tuple[int, str] | None:
    """(rank, the line from its rank prefix on) of a trainer's line, wherever the prefix starts (a launcher or a
    job's stream may put its own in front); None for a line no rank wrote."""
    at = line.find(RANK_OPEN)
    while at != -1:
        number, close, _ = line[at + len(RANK_OPEN) :].partition("]")
        if close and number.isdigit():
            return int(number), line[at:]
        at = line.find(RANK_OPEN, at + 1)
    return None


@dataclass(frozen=True)
class Progress:
    """Where training is, every --log-every steps (from the rank that reports the loss)."""

    epoch: int  # from 1
    step: int  # the global step: optimizer steps since the run began
    step_in_epoch: int
    steps_per_epoch: int
    loss: float  # this step's
    lr: float  # the next step's learning rate
    images_per_sec: float  # every replica's, this epoch so far
    kind: Literal["progress"] = "progress"


@dataclass(frozen=True)
class Checkpointed:
    """A checkpoint of global step `step` was written, or (resumed) the run resumed from it."""

    step: int
    resumed: bool = False
    kind: Literal["checkpoint"] = "checkpoint"


@dataclass(frozen=True)
class Failure:
    """Why a rank stops: its input ("input": exit status 2, and another attempt would fail alike), a fault the
    message names ("fault": a full disk, say; a re-run resumes), an unexpected error ("unexpected": a traceback
    follows in the log), or, of a user's script (scriptrun/rank.py says which), its usage error or syntax error
    ("usage": the run's input, never retried) or its own failure ("script": another attempt would meet the same
    bug)."""

    message: str
    cause: Literal["input", "fault", "unexpected", "usage", "script"] = "input"
    kind: Literal["failure"] = "failure"


Event = Progress | Checkpointed | Failure
EVENTS: dict[str, type[Progress] | type[Checkpointed] | type[Failure]] = {
    "progress": Progress,
    "checkpoint": Checkpointed,
    "failure": Failure,
}


def event_line(event: Event) -> str:
    """The event as the text a trainer logs."""
    return EVENT_MARK + json.dumps(dataclasses.asdict(event), separators=(",", ":"))


def read_event(line: str) -> Event | None:
    """The event a line carries, or None for a line of the log for people (or one cut short)."""
    _, mark, text = line.partition(EVENT_MARK)
    if not mark:
        return None
    try:
        fields = json.loads(text)
        return EVENTS[fields.pop("kind")](**fields)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass
class EpochRow:
    """One epoch of metrics.json: training over every replica, then validation (None without a val split)."""

    epoch: int  # from 1
    step: int  # the global step at its end
    train_loss: float  # mean over every replica's images
    images_per_sec: float  # every replica's
    images_per_sec_per_worker: float
    steady_images_per_sec: float  # after each rank's first step of the epoch
    epoch_seconds: float
    lr: float  # the next step's
    data_wait_share: list[float] | None  # per rank; None where the trainer cannot see its waits (Keras's fit)
    training_thread_cpu_ms_per_step: float
    other_threads_cpu_ms_per_step: float
    val_loss: float | None = None
    val_top1: float | None = None
    val_top5: float | None = None


@dataclass
class Metrics:
    """metrics.json, as rank 0 writes it after each epoch and at the end (status "complete")."""

    status: Literal["running", "complete", "interrupted", "failed"]  # the last two: set by infra/runs/record.py
    model: str
    world_size: int
    backend: str  # the distributed backend: ddp (torch.distributed) or horovod
    wall_seconds: float  # over every resumed attempt
    framework: str = "pytorch"  # metrics.json of runs before it was recorded: pytorch
    schema: int = 0  # SCHEMA when written; 0: before it was recorded
    data: str = ""
    num_classes: int = 0
    device: str = ""
    precision: str = ""
    batch_size_per_worker: int = 0
    global_batch_size: int = 0
    base_lr: float = 0.0
    peak_lr: float = 0.0
    global_step: int = 0
    resumed_from_steps: list[int] = field(default_factory=list)
    final_val_top1: float | None = None
    final_val_top5: float | None = None
    images_per_sec: float | None = None
    data_wait_share: list[float] | None = None
    """Per rank: the share of the last epoch's training time spent waiting for the next batch (the loader) rather
    than computing; high on any rank means the loader underfeeds the GPUs (each epoch's row has its own)."""
    steady_images_per_sec: float | None = None
    """The last epoch's images/s after its first step (which also infers shapes and allocates): what benches use."""
    cpu_ms_per_step: dict[str, float | None] = field(default_factory=dict)
    """The last epoch's CPU ms per step after its first, mean of the ranks: "training_thread" (the thread that runs
    the step) and "other_threads" (the all-reduce's threads; with more than one torch thread, its pool too)."""
    versions: dict[str, str] = field(default_factory=dict)
    trainer: str = ""
    """The training package that ran (which scripts version trained the model)."""
    model_file: str = ""
    train_images: int | None = None
    val_images: int | None = None
    bad_files: dict[str, Any] | None = None
    """Images the run left out because they cannot be decoded (training.bad_files: skip): {"count": N, "list":
    path of the list file (TSV `path<TAB>reason`, in the results), "first": [[path, reason], ...] (up to 20)}."""
    loader: str | None = None
    """The loader that read the images (--loader, or the one --loader auto chose)."""
    loader_workers: int | None = None
    """Its worker processes per training process (DALI: its threads): --loader-workers, or what auto chose."""
    jpeg_decoding: str | None = None
    gpu_decoding: dict[str, int] | None = None
    """--loader gpu's decode thread on rank 0, so far: {"batches", "batches_decoded_at_once": their JPEGs decoded
    by the device in one call, "images_decoded_on_cpu": in the workers (PNG, CMYK...) or after the device refused
    them} (gpu_decode.new_tally)."""
    init_from: dict[str, Any] | None = None
    """The weights the run started from (training.init_from): {"source", "loaded": tensors loaded, "tensors": the
    model's, "new": the names of those made anew (the classifier)}; None: from scratch, or resumed."""
    epochs: list[EpochRow] = field(default_factory=list)
    parameters_in_sync: bool | None = None
    parameter_digest: str | None = None
    parameters_per_rank: list[int] = field(default_factory=list)
    parameter_bytes_per_rank: list[int] = field(default_factory=list)
    peak_memory_mb: list[float] = field(default_factory=list)
    """Per rank: peak memory (allocated on CUDA, the process's own peak resident set on the CPU)."""
    training_memory_mb: list[float] = field(default_factory=list)
    """Per rank: the part of the peak that the model and its training added (on the CPU: above the resident set
    before the model was built; on CUDA the same as peak_memory_mb)."""
    parallel: str = "data"
    pipeline: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object metrics.json holds."""
        return dataclasses.asdict(self)
