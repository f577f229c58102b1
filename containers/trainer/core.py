"""The training loop of every framework, and the run's policy: torch-free and TensorFlow-free. Each framework gives
it an `Adapter` (trainer/train.py: PyTorch; trainer/tf/run.py: TensorFlow and Keras): how to build, step, evaluate,
save and load its model, and its collectives. This module owns the rest, once:

- the order of an epoch: its steps from the first not yet done, a checkpoint every --checkpoint-every steps, the
  progress every --log-every steps, then at its end the batch-norm statistics averaged over the replicas, the
  validation, the epoch's row, a checkpoint and metrics.json;
- the learning-rate schedule (trainer/schedule.py) and the resume position: a checkpoint's progress (the epoch, the
  step, the images of the epoch already trained on, the history, the wall time) and a run of another model or class
  list refused;
- the preflight (`check_only`: the options, the output folder, the data, the checkpoints already in OUT, one step);
- the results: the parameter-sync check, each rank's memory, the model file and metrics.json (nodelib/records.py's
  `Metrics`), and the events the orchestrator reads (`Progress`, `Checkpointed`).

Keras's fit drives its own steps: its callbacks (trainer/tf/fit.py) call `after_step` and `end_epoch`.
"""

import logging
import time
from argparse import Namespace
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from nodelib.errors import UsageError
from nodelib.layout import SYNTHETIC, index_folder
from nodelib.records import SCHEMA, Checkpointed, EpochRow, Metrics, Progress
from trainer import badfiles, checkpoint, console, tracking
from trainer.options import check_batch_fits, check_output_folder, decay_epochs
from trainer.schedule import Schedule, lr_factor
from trainer.throughput import Throughput, digest_chunks

log = logging.getLogger("trainer")


class Adapter(Protocol):
    """What a framework supplies to the loop. Collectives are float64 sums over every worker (`sum`) or over the
    model's replicas (`sum_over_replicas`: the same but in pipeline mode, where a rank holds one stage)."""

    @property
    def framework(self) -> str:
        """metrics.json's "framework": pytorch, tensorflow, keras."""

    @property
    def backend(self) -> str:
        """The distributed backend: ddp or horovod."""

    @property
    def device(self) -> str:
        """ "cpu" or "cuda:<n>"."""

    @property
    def precision(self) -> str:
        """ "bf16" or "fp32"."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def replicas(self) -> int:
        """Model replicas, each on its own shard of the data (the workers, or the pipelines)."""

    @property
    def reports_loss(self) -> bool:
        """Whether this rank has the loss: rank 0, or a pipeline's last stage of replica 0."""

    @property
    def model_file(self) -> str:
        """What rank 0 writes into OUT at the end: model.pt, model.keras."""

    def sum(self, values: list[float]) -> list[float]: ...

    def sum_over_replicas(self, values: list[float]) -> list[float]: ...

    def steps_per_epoch(self) -> int: ...

    def epoch_batches(self, epoch: int, skip: int) -> Iterator: ...

    def train_step(self, batch: Any, step: int) -> tuple[Any, int]:
        """One optimizer step at global step `step`: (the batch's mean loss, a tensor left on the device, or None on
        a pipeline stage that has no loss; the images)."""

    def add_loss(self, total: Any, loss: Any, images: int) -> Any:
        """`total` (None at an epoch's start) plus the batch's summed loss, left on the device."""

    def average_statistics(self) -> None:
        """Average the batch-norm statistics over the replicas (each saw its own batches)."""

    def evaluate(self) -> list[float] | None:
        """This rank's (summed loss, top-1 hits, top-5 hits, images) over its val shard; None without val data."""

    def save_checkpoint(self, progress: dict, step: int) -> None:
        """Write the model, the optimizer and `progress` (every rank calls it; rank 0 commits the checkpoint)."""

    def digest(self) -> str:
        """SHA-256 of the parameters this rank holds (not the batch-norm statistics)."""

    def memory(self) -> tuple[int, int, float, float]:
        """(parameters held, their bytes with the buffers, peak memory MB, the part of it training added)."""

    def save_model(self, out: Path, classes: list[str]) -> str:
        """Rank 0 (every rank calls it: a pipeline gathers the stages): write the trained model into `out`; the
        whole model's parameter digest."""

    def versions(self) -> dict[str, str]: ...

    def results(self) -> dict:
        """What else metrics.json records of this framework's run (pipeline mode's split and schedule, say)."""

    def close(self) -> None: ...


A = TypeVar("A", bound=Adapter)


@dataclass
class Run(Generic[A]):
    """Where one worker's training is, whatever the framework (its adapter, of type A)."""

    args: Namespace
    adapter: A
    classes: list[str]
    data_facts: dict = field(default_factory=dict)  # images trained and validated on, the bad ones left out
    schedule: Schedule = Schedule(1, 1)  # made once the steps of an epoch are known (make_schedule)
    step: int = 0
    epoch: int = 0
    skip_steps: int = 0  # steps of the current epoch done before a resume
    history: list[EpochRow] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    wall_before: float = 0.0  # seconds spent by the attempts before a resume
    started: float = field(default_factory=time.perf_counter)
    tracker: tracking.Tracker = field(default_factory=tracking.Tracker)  # off unless --tracking-uri

    @property
    def master(self) -> bool:
        return self.adapter.rank == 0

    def wall_seconds(self) -> float:
        """Wall time of the whole run, over every resumed attempt."""
        return self.wall_before + time.perf_counter() - self.started

    def learning_rate(self, step: int) -> float:
        return rate_at(self.args, self.schedule, step)


def rate_at(args: Namespace, schedule: Schedule, step: int) -> float:
    """The rate of optimizer step `step` (0-based): the one-worker rate times the schedule's factor."""
    return args.lr * lr_factor(step, schedule)


def make_schedule(args: Namespace, steps_per_epoch: int, replicas: int) -> Schedule:
    """Warmup from the one-worker rate to it times the replicas, then --schedule's decay, per optimizer step."""
    return Schedule(
        steps_per_epoch, args.epochs, replicas, args.warmup_epochs, args.schedule, decay_epochs(args.lr_decay_epochs)
    )


# The preflight ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checks:
    """What the preflight asks of a framework, without building a worker."""

    check_model_name: Callable[[str], None]
    newest_progress: Callable[[Path], dict | None]  # the progress of the newest checkpoint in a folder, if any
    try_one_step: Callable[[Namespace, int], None]  # one forward and backward pass with this many classes
    start_from: Callable[[Namespace, list[str]], dict]  # --init-from's weights loaded into a model for these classes


def check_only(args: Namespace, checks: Checks, replicas: int) -> int:
    """The preflight, in one process before any worker starts: the model's name, the output folder, the data
    (decoding every image with --verify-images, the bad ones found handed to the workers), the checkpoints already
    in OUT (another run's refused), one step on a tiny batch. The number of classes."""
    checks.check_model_name(args.model)
    check_output_folder(args.out)
    classes = synthetic_classes(args.num_classes)
    if args.data != SYNTHETIC:
        train_split, _, record, source = badfiles.usable_splits(args, Path(args.out), index_folder(Path(args.data)))
        if source == badfiles.DECODED:
            badfiles.hand_to_workers(Path(args.out), record)  # the workers skip what this decode found
        check_batch_fits(args.batch_size, replicas, len(train_split.samples))
        classes = train_split.classes
        log.info("data ok: %d training images in %d classes", len(train_split.samples), len(classes))
    if (progress := checks.newest_progress(checkpoints_folder(args))) is not None:
        check_resumable(progress, args.model, classes, args.out)
    checks.try_one_step(args, len(classes))
    if args.init_from:  # once here, so that imagenet's download is made before the workers read it
        console.started_from(checks.start_from(args, classes))
    return len(classes)


def synthetic_classes(num_classes: int) -> list[str]:
    """The class names of synthetic data: its class indices."""
    return [str(i) for i in range(num_classes)]


def checkpoints_folder(args: Namespace) -> Path:
    """Where checkpoints live inside OUT."""
    return Path(args.out) / "checkpoints"


# Resuming --------------------------------------------------------------------------------------------------------


def check_resumable(progress: dict, model: str, classes: list[str], out: str, same_shapes: bool = True) -> None:
    """A checkpoint of another model, class list (or, `same_shapes` false, variable layout) cannot be resumed: the
    preflight and every worker check it."""
    if progress["arch"] != model or progress["classes"] != classes or not same_shapes:
        theirs = ", ".join(
            [progress["arch"], f"{len(progress['classes'])} classes", *filter(None, [progress.get("framework")])]
        )
        raise UsageError(
            f"{out} holds checkpoints of another run ({theirs}; this run: {model}, {len(classes)} classes); pass a "
            "new --out or delete its checkpoints/"
        )


def progress_state(run: Run, step_in_epoch: int) -> dict:
    """What a checkpoint holds besides the tensors: enough to resume at this very step."""
    return {
        "framework": run.adapter.framework,
        "arch": run.args.model,
        "classes": run.classes,
        "epoch": run.epoch,
        "step": run.step,
        "history": [asdict(row) for row in run.history],
        "resumed_from": run.resumed_from,
        "samples_in_epoch": step_in_epoch * run.args.batch_size * run.adapter.replicas,
        "wall_seconds": run.wall_seconds(),
    }


def restore(run: Run, progress: dict, name: str) -> None:
    """Continue from a checkpoint's progress (`name`, its file): the step count, the history, the wall time, and the
    steps of the epoch already trained on, skipped."""
    run.step, run.epoch = progress["step"], progress["epoch"]
    run.history = [EpochRow(**row) for row in progress["history"]]
    run.wall_before = progress["wall_seconds"]
    run.resumed_from = progress["resumed_from"] + [run.step]
    run.skip_steps = progress["samples_in_epoch"] // (run.args.batch_size * run.adapter.replicas)
    log.info("resumed from %s: epoch %d, step %d", name, run.epoch + 1, run.step)
    console.event(Checkpointed(run.step, resumed=True))


def save_checkpoint(run: Run, step_in_epoch: int) -> None:
    """Called on every rank: the adapter writes the tensors and the progress; then the step is announced."""
    run.adapter.save_checkpoint(progress_state(run, step_in_epoch), run.step)
    if run.master:
        log.info("checkpoint step %d saved", run.step)
        console.event(Checkpointed(run.step))


# The loop --------------------------------------------------------------------------------------------------------


def train(run: Run) -> None:
    """Every epoch left, then the results."""
    while run.epoch < run.args.epochs:
        end_epoch(run, train_epoch(run))
    finish(run)


def train_epoch(run: Run) -> EpochRow:
    """One epoch of synchronous SGD from its first step not yet done; its row of metrics.json (before validation)."""
    adapter, steps = run.adapter, run.adapter.steps_per_epoch()
    done, run.skip_steps = run.skip_steps, 0
    batches = adapter.epoch_batches(run.epoch, done)
    # the loss stays on the device until the epoch ends (or a progress line): no host-device sync in the step
    total, counted = None, Throughput()
    while done < steps and (batch := counted.next_batch(batches)) is not None:
        loss, images = adapter.train_step(batch, run.step)
        done = after_step(run, done, loss, images, counted)
        if loss is not None:
            total = adapter.add_loss(total, loss, images)
    return epoch_row(run, 0.0 if total is None else float(total), counted)


def after_step(run: Run, done: int, loss: Any, images: int, counted: Throughput) -> int:
    """After a step: count it, checkpoint every --checkpoint-every steps, and every --log-every steps print the
    progress (on the rank with the loss); the steps of the epoch now done. `loss` is a tensor or a float (None on a
    pipeline stage before the last, which counts no images)."""
    args = run.args
    done, run.step = done + 1, run.step + 1
    if args.checkpoint_every and run.step % args.checkpoint_every == 0:
        save_checkpoint(run, step_in_epoch=done)
    if loss is None:
        return done
    counted.count(images)
    if run.adapter.reports_loss and run.step % args.log_every == 0:
        log_step(run, done, float(loss), counted)
    return done


def log_step(run: Run, done: int, loss: float, counted: Throughput) -> None:
    """The progress line and event, and the step's metrics to the tracker: lr is the next step's, images/s this
    rank's rate so far this epoch times the replicas (all of them, as the epoch's row counts)."""
    lr, images_per_sec = run.learning_rate(run.step), counted.rates()[1] * run.adapter.replicas
    steps = run.adapter.steps_per_epoch()
    console.progress(run.tracker, Progress(run.epoch + 1, run.step, done, steps, loss, lr, images_per_sec))


def epoch_row(run: Run, loss_sum: float, counted: Throughput, measured_waits: bool = True) -> EpochRow:
    """An epoch's row: the loss over every replica's images, their images/s, each rank's data-wait share (None where
    the trainer cannot see its waits: Keras's fit pulls batches inside its step), CPU time per step."""
    seconds, rate, steady = counted.rates()
    totals = run.adapter.sum([loss_sum, counted.seen, rate, steady, *counted.cpu_ms_per_step()])
    workers = run.adapter.world_size
    waits = rank_values(run.adapter, counted.data_wait_share()) if measured_waits else None
    return EpochRow(
        epoch=run.epoch + 1,
        step=run.step,
        train_loss=totals[0] / max(totals[1], 1),
        images_per_sec=totals[2],
        images_per_sec_per_worker=totals[2] / workers,
        steady_images_per_sec=totals[3],
        epoch_seconds=seconds,
        lr=run.learning_rate(run.step),
        data_wait_share=[round(w, 4) for w in waits] if waits is not None else None,
        training_thread_cpu_ms_per_step=totals[4] / workers,
        other_threads_cpu_ms_per_step=totals[5] / workers,
    )


def end_epoch(run: Run, row: EpochRow) -> None:
    """After an epoch's last step, on every worker: average the batch-norm statistics, validate, record the row,
    checkpoint, and (rank 0) rewrite metrics.json."""
    run.adapter.average_statistics()
    row.val_loss, row.val_top1, row.val_top5 = evaluate(run)
    run.history.append(row)
    run.epoch += 1
    run.tracker.log(tracking.epoch_metrics(asdict(row)), run.step)
    if run.master:
        console.epoch_done(row, run.args.epochs)
    save_checkpoint(run, step_in_epoch=0)
    if run.master:
        write_metrics(run, status="running")


def evaluate(run: Run) -> tuple[float | None, float | None, float | None]:
    """Validation loss and top-1/top-5 accuracy over the whole val split, summed over the workers."""
    mine = run.adapter.evaluate()
    if mine is None:
        return None, None, None
    loss, top1, top5, n = run.adapter.sum(mine)
    n = max(n, 1)
    return loss / n, top1 / n, top5 / n


# Collectives -----------------------------------------------------------------------------------------------------


def rank_values(adapter: Adapter, value: float) -> list[float]:
    """`value` of every rank, in rank order (a sum of one-hot vectors)."""
    mine = [0.0] * adapter.world_size
    mine[adapter.rank] = value
    return adapter.sum(mine)


def parameters_in_sync(adapter: Adapter, digest: str) -> bool:
    """Whether every replica ends with the same parameters (in pipeline mode: each stage as its replicas), from each
    rank's digest: equal values are the only ones whose sum squared is the count times the sum of squares."""
    chunks = digest_chunks(digest)
    sums = adapter.sum_over_replicas([*chunks, *(c * c for c in chunks)])
    n = len(chunks)
    differs = any(sums[n + i] * adapter.replicas != sums[i] ** 2 for i in range(n))
    return adapter.sum([float(differs)])[0] == 0


# Results ---------------------------------------------------------------------------------------------------------


def finish(run: Run) -> None:
    """Check that the replicas hold the same parameters; rank 0 writes the model and metrics.json."""
    adapter = run.adapter
    memory = memory_report(adapter)
    extra = adapter.results()  # measured before rank 0 puts the model together
    digest = adapter.digest()
    in_sync = parameters_in_sync(adapter, digest)
    log.info("final parameter digest %s (all workers identical: %s)", digest[:16], in_sync)
    whole_digest = adapter.save_model(Path(run.args.out), run.classes)
    if run.master:
        write_metrics(run, "complete", parameters_in_sync=in_sync, parameter_digest=whole_digest, **memory, **extra)
        log.info("results in %s", Path(run.args.out).resolve())
    run.tracker.close()
    adapter.close()


def memory_report(adapter: Adapter) -> dict:
    """Per rank: the parameters it holds, their bytes with the buffers, its peak memory and the part of that peak
    its training added (its model, gradients, optimizer state and activations)."""
    params, held, peak, added = adapter.memory()
    return {
        "parameters_per_rank": [int(v) for v in rank_values(adapter, params)],
        "parameter_bytes_per_rank": [int(v) for v in rank_values(adapter, held)],
        "peak_memory_mb": rank_values(adapter, peak),
        "training_memory_mb": rank_values(adapter, added),
    }


def write_metrics(run: Run, status: Literal["running", "complete"], **extra) -> None:
    """Rank 0: metrics.json, rewritten after every epoch; status says whether the run is complete."""
    args, adapter = run.args, run.adapter

    def last(name: str) -> Any:
        """The last epoch's value of `name` (None before an epoch ends)."""
        return getattr(run.history[-1], name) if run.history else None

    metrics = Metrics(
        schema=SCHEMA,
        status=status,
        framework=adapter.framework,
        model=args.model,
        data=str(args.data),
        num_classes=len(run.classes),
        world_size=adapter.world_size,
        backend=adapter.backend,
        device=adapter.device,
        precision=adapter.precision,
        batch_size_per_worker=args.batch_size,
        global_batch_size=args.batch_size * adapter.replicas,
        base_lr=args.lr,
        peak_lr=args.lr * adapter.replicas,
        global_step=run.step,
        resumed_from_steps=run.resumed_from,
        wall_seconds=run.wall_seconds(),
        final_val_top1=last("val_top1"),
        final_val_top5=last("val_top5"),
        images_per_sec=last("images_per_sec"),
        data_wait_share=last("data_wait_share"),
        steady_images_per_sec=last("steady_images_per_sec"),
        versions=adapter.versions(),
        cpu_ms_per_step={
            "training_thread": last("training_thread_cpu_ms_per_step"),
            "other_threads": last("other_threads_cpu_ms_per_step"),
        },
        trainer=str(Path(__file__).resolve().parent),  # the training package: which scripts version trained
        model_file=adapter.model_file,
        epochs=run.history,
        **run.data_facts,
        **extra,
    )
    checkpoint.save_json(Path(args.out) / "metrics.json", metrics.to_json())
