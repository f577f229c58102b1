"""What the TensorFlow trainer (loop.py) and the Keras trainer (fit.py) share: the worker under Horovod, its
logging, the model and optimizer, the learning-rate schedule, checkpoints, validation and the results.

The output is the PyTorch trainer's (train.py, infra/engines/contract.py): every line starts with `[rank N]`, bad
input is one `ERROR error: MESSAGE` line and exit status 2, the progress line is the one the orchestrator reads,
and rank 0 writes metrics.json with the same fields, plus "framework". The choices that make the two frameworks
train alike:

- SGD as torch.optim.SGD computes it (`TorchSGD`): v = momentum * v + (g + weight_decay * w); w -= lr * v. Weight
  decay is coupled, added to the averaged gradient of every trainable variable (kernels, biases and batch-norm
  scales and offsets, as train.py decays all of model.parameters()), not an L2 term in the loss: the loss
  reported is the cross-entropy alone, and a change of rate does not rescale the momentum as Keras's SGD does.
- The rate is lr x workers after a linear warmup from lr, then cosine or step decay (trainer/schedule.py), set
  before each step from the global step, by both trainers.
- Batch-norm statistics are averaged over the workers at each epoch's end (each saw its own batches).

Checkpoints are OUT/checkpoints/step-<9 digits>.npz, one file written atomically by rank 0: every variable of the
model (batch-norm statistics included) and of the optimizer (its momentum slots), and the progress (epoch, step,
the images of the epoch already trained on, history, wall time) as JSON. A run started again with the same OUT
resumes from the newest one at its exact step, mid-epoch included, and ends with the parameters of a run that was
never interrupted. The model is OUT/model.keras (Keras's own format: `tf_keras.models.load_model` reads it).
"""

import argparse
import hashlib
import json
import logging
import os
import platform
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
import tf_keras as keras

from trainer import badfiles, checkpoint, console, tracking
from trainer.errors import UsageError
from trainer.layout import SYNTHETIC, index_folder
from trainer.memory import peak_resident_mb, resident_mb
from trainer.options import check_output_folder, decay_epochs
from trainer.schedule import Schedule, lr_factor
from trainer.tf import data, models
from trainer.tf.options import build_parser, check_args
from trainer.throughput import Throughput, digest_chunks, installed_versions

log = logging.getLogger("trainer")
CHECKPOINT = re.compile(r"step-(\d{9})\.npz$")
MODEL_FILE = "model.keras"


@dataclass(frozen=True)
class Worker:
    """This process's place among the Horovod workers."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1


@dataclass
class Run:
    """Everything one worker's training touches, in either trainer."""

    args: argparse.Namespace
    framework: str  # "tensorflow" (loop.py) or "keras" (fit.py)
    worker: Worker
    device: str  # "cpu" or "cuda:<n>", as train.py names it
    precision: str  # "bf16" or "fp32"
    images: data.Images
    steps: int  # steps of one full epoch
    schedule: Schedule
    model: keras.Model
    optimizer: keras.optimizers.legacy.Optimizer
    step: int = 0
    epoch: int = 0
    skip_steps: int = 0  # steps of the current epoch done before a resume
    history: list[dict] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    wall_before: float = 0.0  # seconds spent by the attempts before a resume
    started: float = field(default_factory=time.perf_counter)
    resident_before_model_mb: float = 0.0
    tracker: tracking.Tracker = field(default_factory=tracking.Tracker)
    evaluate_batch: Callable | None = None  # the tf.function that scores a val batch, made once

    @property
    def master(self) -> bool:
        return self.worker.rank == 0

    def wall_seconds(self) -> float:
        """Wall time of the whole run, over every resumed attempt."""
        return self.wall_before + time.perf_counter() - self.started

    def learning_rate(self, step: int) -> float:
        """The rate of optimizer step `step` (0-based): the one-worker rate times the schedule's factor."""
        return self.args.lr * lr_factor(step, self.schedule)


def main(train: Callable, prog: str, argv: list[str] | None = None) -> int:
    """Parse the arguments, check them (--check: only that) or `train`; bad input is one line and exit status 2."""
    return console.run_main(build_parser(prog).parse_args(argv), check_args, check_only, train)


def check_only(args) -> int:
    """Validate the arguments, output folder, data (decoding every image with --verify-images) and model, in one
    process, without Horovod: the preflight before any worker starts."""
    models.check_model_name(args.model)
    check_output_folder(args.out)
    num_classes = args.num_classes
    if args.data != SYNTHETIC:
        train_split, _, record, source = badfiles.usable_splits(args, Path(args.out), index_folder(Path(args.data)))
        if source == badfiles.DECODED:
            badfiles.hand_to_workers(Path(args.out), record)  # the workers skip what this decode found
        badfiles.check_batch_fits(args.batch_size, args.check_workers, len(train_split.samples))
        num_classes = len(train_split.classes)
        log.info("data ok: %d training images in %d classes", len(train_split.samples), num_classes)
    try_one_step(args, num_classes)
    return 0


def try_one_step(args, num_classes: int) -> None:
    """Build the model and run one forward and backward pass on a tiny batch of the configured size, on the CPU."""
    try:
        with tf.device("/CPU:0"):
            model = models.build_model(args.model, num_classes, args.image_size, args.seed)
            images = tf.zeros((min(args.batch_size, 2), args.image_size, args.image_size, 3))
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(images, training=True))
            tape.gradient(loss, model.trainable_variables)
    except (ValueError, tf.errors.InvalidArgumentError) as exc:
        raise UsageError(
            f"{args.model} cannot train on batches of {args.batch_size} images of {args.image_size} px "
            f"({str(exc).strip().splitlines()[0]}); change --batch-size, --image-size or --model"
        ) from None


def start_worker(args, framework: str) -> tuple[Worker, str, str]:
    """Join the Horovod workers (one process without a launcher is a world of one), share the cores, pick the
    device and the precision; (worker, device, precision)."""
    hvd.init()  # Horovod:
    worker = Worker(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
    console.setup_logging(worker.rank)
    threads = args.threads or max(1, len(os.sched_getaffinity(0)) // worker.local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)  # before TensorFlow's runtime starts
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    device = pick_device(args.device, worker.local_rank)
    precision = ("bf16" if device != "cpu" else "fp32") if args.precision == "auto" else args.precision
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if precision == "bf16" else "float32")
    log.info(
        "worker %d of %d (horovod, %s) on host %s, %s, %d threads",
        worker.rank,
        worker.size,
        framework,
        socket.gethostname(),
        device,
        threads,
    )
    return worker, device, precision


def pick_device(requested: str, local_rank: int) -> str:
    """cuda:<local rank> (this worker's GPU, the only one it sees) when a GPU is there or asked for, else cpu."""
    gpus = tf.config.list_physical_devices("GPU")
    if requested == "cuda" and not gpus:
        raise UsageError("--device cuda, but TensorFlow sees no GPU here; pass --device cpu or auto")
    if requested == "cpu" or not gpus:
        tf.config.set_visible_devices([], "GPU")
        return "cpu"
    index = local_rank % len(gpus)
    tf.config.set_visible_devices([gpus[index]], "GPU")
    tf.config.experimental.set_memory_growth(gpus[index], True)  # allocate as needed: peak_memory_mb is the use
    return f"cuda:{index}"


class TorchSGD(keras.optimizers.legacy.SGD):
    """SGD with momentum and coupled weight decay as torch.optim.SGD computes it: d = g + weight_decay * w,
    v = momentum * v + d, w -= lr * v (TensorFlow's ResourceApplyMomentum). Keras's own SGD keeps lr inside v
    (v = momentum * v - lr * g), which differs from torch's whenever the rate changes, as in warmup and decay."""

    def __init__(self, learning_rate=0.01, momentum=0.9, weight_decay=0.0, name="TorchSGD", **kwargs):
        super().__init__(learning_rate=learning_rate, momentum=momentum, name=name, **kwargs)
        self.weight_decay = weight_decay

    def _create_slots(self, var_list):
        for var in var_list:  # always: a momentum of 0 is plain SGD, with the same checkpoint layout
            self.add_slot(var, "momentum")

    def _resource_apply_dense(self, grad, var, apply_state=None):
        coefficients = (apply_state or {}).get((var.device, var.dtype.base_dtype)) or self._fallback_apply_state(
            var.device, var.dtype.base_dtype
        )
        if self.weight_decay:
            grad = grad + tf.cast(self.weight_decay, grad.dtype) * var
        return tf.raw_ops.ResourceApplyMomentum(
            var=var.handle,
            accum=self.get_slot(var, "momentum").handle,
            lr=coefficients["lr_t"],
            grad=grad,
            momentum=coefficients["momentum"],
            use_locking=self._use_locking,
            use_nesterov=False,
        )

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        raise NotImplementedError("TorchSGD updates dense gradients only (the ResNets have no embeddings)")

    def get_config(self):
        return {**super().get_config(), "weight_decay": self.weight_decay}


def set_up(args, framework: str, wrap_optimizer: Callable = lambda optimizer: optimizer) -> Run:
    """Start the worker, load the data, build the model and the optimizer (through `wrap_optimizer`: Horovod's
    DistributedOptimizer for fit), resume from the newest checkpoint in OUT, and start every worker from rank 0's
    variables."""
    worker, device, precision = start_worker(args, framework)
    tf.random.set_seed(args.seed)
    if worker.rank == 0:
        check_output_folder(args.out)
    models.check_model_name(args.model)
    images = data.load(args, Path(args.out), worker.rank, worker.size)
    steps = data.steps_per_epoch(images, args, worker.size)
    schedule = Schedule(
        steps, args.epochs, worker.size, args.warmup_epochs, args.schedule, decay_epochs(args.lr_decay_epochs)
    )
    before_model = resident_mb()
    keras.backend.clear_session()  # layer names as in a fresh process: the parameter digest names them
    model = models.build_model(args.model, len(images.classes), args.image_size, args.seed)
    optimizer = wrap_optimizer(TorchSGD(args.lr, args.momentum, args.weight_decay))
    optimizer._create_all_weights(model.trainable_variables)  # momentum slots now: to restore and broadcast
    run = Run(args, framework, worker, device, precision, images, steps, schedule, model, optimizer)
    run.resident_before_model_mb = before_model
    resume(run)
    # Horovod: every worker starts from rank 0's model and optimizer state (a resumed one, or its initialisation)
    hvd.broadcast_variables(model.variables + optimizer.variables(), root_rank=0)
    run.tracker = open_tracker(args, run.master)
    return run


def open_tracker(args, logs: bool) -> tracking.Tracker:
    """tracking.open_tracker's Tracker, with TensorBoard event files written by tf.summary (torch's SummaryWriter
    is not in this image)."""
    if not logs:
        return tracking.Tracker()
    tracking.check_trackers(args.tracking_uri, args.tensorboard)
    writer = SummaryWriter(Path(args.tensorboard) / Path(args.out).name) if args.tensorboard else None
    if not args.tracking_uri:
        return tracking.Tracker(writer=writer)
    client, run_id, owned = tracking.open_mlflow_run(args.tracking_uri, args.tracking_run_id, vars(args))
    return tracking.Tracker(client, run_id, owned, writer)


class SummaryWriter:
    """TensorBoard event files through tf.summary, with the two methods of torch's SummaryWriter that
    tracking.Tracker calls."""

    def __init__(self, folder: Path):
        self.writer = tf.summary.create_file_writer(str(folder))

    def add_scalar(self, key: str, value: float, step: int) -> None:
        with self.writer.as_default():
            tf.summary.scalar(key, value, step=step)

    def close(self) -> None:
        self.writer.close()


# Checkpoints ---------------------------------------------------------------------------------------------------


def checkpoints_folder(args) -> Path:
    """Where checkpoints live inside OUT."""
    return Path(args.out) / "checkpoints"


def save_checkpoint(run: Run, step_in_epoch: int) -> None:
    """Rank 0: the model, the optimizer and the progress, enough to resume at this very step; the newest
    --keep-checkpoints kept."""
    if not run.master:
        return
    progress = {
        "framework": run.framework,
        "arch": run.args.model,
        "classes": run.images.classes,
        "epoch": run.epoch,
        "step": run.step,
        "history": run.history,
        "resumed_from": run.resumed_from,
        "samples_in_epoch": step_in_epoch * run.args.batch_size * run.worker.size,
        "wall_seconds": run.wall_seconds(),
    }
    arrays = {f"model/{i}": v.numpy() for i, v in enumerate(run.model.variables)}
    arrays |= {f"optimizer/{i}": v.numpy() for i, v in enumerate(run.optimizer.variables())}
    folder = checkpoints_folder(run.args)
    need = sum(a.nbytes for a in arrays.values())  # checked against the free space before the write starts
    path = checkpoint.write_atomic(folder / f"step-{run.step:09d}.npz", lambda p: write_npz(p, arrays, progress), need)
    prune_checkpoints(folder, run.args.keep_checkpoints, keep_also=path)
    log.info("checkpoint step %d saved", run.step)  # what a resubmitting backend counts lost work from


def write_npz(path: Path, arrays: dict[str, Any], progress: dict) -> None:
    """The arrays and the progress (as JSON text) in one uncompressed .npz file."""
    with open(path, "wb") as f:
        np.savez(f, progress=np.array(json.dumps(progress)), **arrays)


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoints in `folder`, oldest first."""
    return sorted(p for p in folder.iterdir() if CHECKPOINT.match(p.name)) if folder.is_dir() else []


def prune_checkpoints(folder: Path, keep: int, keep_also: Path) -> None:
    """Delete all but the newest `keep` checkpoints (and `keep_also`), and halves left by a killed writer."""
    kept = {p.name for p in list_checkpoints(folder)[-keep:]} | {keep_also.name}
    for old in [*list_checkpoints(folder), *folder.glob(".step-*.npz.tmp-*")]:
        if old.name not in kept:
            old.unlink(missing_ok=True)


def resume(run: Run) -> None:
    """Load the newest checkpoint in OUT, if any: variables, step, epoch, history, wall time, and the steps of the
    epoch to skip."""
    found = list_checkpoints(checkpoints_folder(run.args))
    if not found:
        return
    with np.load(found[-1]) as saved:
        progress = json.loads(str(saved["progress"]))
        check_resumable(run, progress, saved)
        for i, v in enumerate(run.model.variables):
            v.assign(saved[f"model/{i}"])
        for i, v in enumerate(run.optimizer.variables()):
            v.assign(saved[f"optimizer/{i}"])
    run.step, run.epoch, run.history = progress["step"], progress["epoch"], progress["history"]
    run.wall_before = progress["wall_seconds"]
    run.resumed_from = progress["resumed_from"] + [run.step]
    run.skip_steps = progress["samples_in_epoch"] // (run.args.batch_size * run.worker.size)
    log.info("resumed from %s: epoch %d, step %d", found[-1].name, run.epoch + 1, run.step)


def check_resumable(run: Run, progress: dict, saved) -> None:
    """A checkpoint of another model, class list or optimizer layout cannot be resumed."""
    mine = [tuple(v.shape) for v in run.model.variables + run.optimizer.variables()]
    theirs = [saved[f"model/{i}"].shape for i in range(len(run.model.variables))]
    theirs += [saved[f"optimizer/{i}"].shape for i in range(sum(k.startswith("optimizer/") for k in saved.files))]
    if progress["arch"] != run.args.model or progress["classes"] != run.images.classes or mine != theirs:
        raise UsageError(
            f"{run.args.out} holds checkpoints of another run ({progress['arch']}, {len(progress['classes'])} "
            f"classes, {progress.get('framework')}); pass a new --out or delete its checkpoints/"
        )


# Steps, epochs, validation ---------------------------------------------------------------------------------------


def set_learning_rate(run: Run) -> None:
    """The schedule's rate for the next step (run.step), in the optimizer."""
    run.optimizer.learning_rate = run.learning_rate(run.step)


def log_step(run: Run, done: int, loss: float, counted: Throughput) -> None:
    """The progress line (infra/engines/contract.py's PROGRESS_LINE) and the step's metrics to the tracker; lr is
    the next step's, images/s this rank's rate so far this epoch times the workers, as train.py's."""
    lr, images_per_sec = run.learning_rate(run.step), counted.rates()[1] * run.worker.size
    console.progress(run.tracker, run.epoch + 1, run.step, done, run.steps, loss, lr, images_per_sec)


def epoch_row(run: Run, loss_sum: float, counted: Throughput, measured_waits: bool = True) -> dict:
    """An epoch's row of metrics.json, as train.py's: the loss over all workers' images, their images/s, each
    rank's data-wait share (None where the trainer cannot see its waits: model.fit pulls batches inside its
    step), CPU time per step."""
    seconds, rate, steady = counted.rates()
    totals = all_reduce_sum(
        np.array([loss_sum, counted.seen, rate, steady, *counted.cpu_ms_per_step()]), "trainflow_epoch_totals"
    )
    workers = run.worker.size
    waits = rank_values(run, counted.data_wait_share()) if measured_waits else None
    return {
        "epoch": run.epoch + 1,
        "step": run.step,
        "train_loss": totals[0] / max(totals[1], 1),
        "images_per_sec": totals[2],
        "images_per_sec_per_worker": totals[2] / workers,
        "steady_images_per_sec": totals[3],
        "epoch_seconds": seconds,
        "lr": run.learning_rate(run.step),
        "data_wait_share": [round(w, 4) for w in waits] if waits is not None else None,
        "training_thread_cpu_ms_per_step": totals[4] / workers,
        "other_threads_cpu_ms_per_step": totals[5] / workers,
    }


def end_epoch(run: Run, row: dict) -> None:
    """After an epoch's last step, on every worker: average the batch-norm statistics, validate, record the row,
    checkpoint, and (rank 0) rewrite metrics.json."""
    average_statistics(run)
    row.update(evaluate(run))
    run.history.append(row)
    run.epoch += 1
    log_epoch(run, row)
    save_checkpoint(run, step_in_epoch=0)
    if run.master:
        write_metrics(run, status="running")


def average_statistics(run: Run) -> None:
    """Average the batch-norm moving statistics over the workers (each saw its own batches): one model to evaluate
    and save."""
    stats = [v for v in run.model.non_trainable_variables if v.dtype.is_floating]
    if run.worker.size == 1 or not stats:
        return
    flat = tf.concat([tf.reshape(v, [-1]) for v in stats], axis=0)
    flat = hvd.allreduce(flat, op=hvd.Average, name="trainflow_batch_norm")  # Horovod:
    offset = 0
    for v in stats:
        v.assign(tf.reshape(flat[offset : offset + int(np.prod(v.shape))], v.shape))
        offset += int(np.prod(v.shape))


def evaluate(run: Run) -> dict:
    """Validation loss and top-1/top-5 accuracy over the whole val split, summed across workers."""
    if run.images.val is None:
        return {"val_loss": None, "val_top1": None, "val_top5": None}
    if run.evaluate_batch is None:
        run.evaluate_batch = make_evaluate_batch(run.model, len(run.images.classes))
    sums = np.zeros(4)  # loss, top-1 hits, top-5 hits, images
    for images, labels in data.batches(data.val_dataset(run.images, run.args, run.worker.rank, run.worker.size)):
        sums += run.evaluate_batch(images, labels).numpy()
    loss, top1, top5, n = all_reduce_sum(sums, "trainflow_val").tolist()
    n = max(n, 1)
    return {"val_loss": loss / n, "val_top1": top1 / n, "val_top5": top5 / n}


def make_evaluate_batch(model: keras.Model, num_classes: int) -> Callable:
    """A tf.function: (summed cross-entropy, top-1 hits, top-5 hits, images) of a batch, in float64 (any batch
    length: the last val batch is partial)."""
    k = min(5, num_classes)

    @tf.function(reduce_retracing=True)
    def score(images, labels):
        logits = tf.cast(model(images, training=False), tf.float32)
        labels = tf.cast(labels, tf.int32)
        loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        hits = [tf.math.in_top_k(labels, logits, top) for top in (1, k)]
        values = [tf.reduce_sum(loss), *[tf.reduce_sum(tf.cast(h, tf.float32)) for h in hits], tf.size(labels)]
        return tf.stack([tf.cast(v, tf.float64) for v in values])

    return score


def log_epoch(run: Run, row: dict) -> None:
    """One line per epoch on rank 0; the epoch's metrics to the tracker."""
    run.tracker.log(tracking.epoch_metrics(row), run.step)
    if run.master:
        console.epoch_done(row, run.args.epochs)


# Collectives -----------------------------------------------------------------------------------------------------


def all_reduce_sum(values: np.ndarray, name: str) -> np.ndarray:
    """`values` (float64) summed over the workers."""
    return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum, name=name).numpy()  # Horovod:


def rank_values(run: Run, value: float) -> list[float]:
    """`value` of every rank, in rank order (a sum of one-hot vectors)."""
    mine = np.zeros(run.worker.size)
    mine[run.worker.rank] = value
    return all_reduce_sum(mine, "trainflow_rank_values").tolist()


def parameter_digest(variables: list) -> str:
    """SHA-256 of every (name, value) of `variables` (the trainable ones: batch-norm statistics are not
    parameters, as in train.py's digest)."""
    h = hashlib.sha256()
    for v in variables:
        h.update(v.name.encode())
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()


def parameters_in_sync(run: Run, digest: str) -> bool:
    """Whether every worker ends with the same parameters, from each rank's digest: equal values are the only ones
    whose sum squared is the count times the sum of squares (train.py's test)."""
    chunks = np.array(digest_chunks(digest))
    sums = all_reduce_sum(np.stack([chunks, chunks**2]), "trainflow_digest")
    return bool(np.array_equal(sums[1] * run.worker.size, sums[0] ** 2))


# Results ---------------------------------------------------------------------------------------------------------


def finish(run: Run) -> None:
    """Check that the workers hold the same parameters; rank 0 writes model.keras and metrics.json."""
    memory = memory_report(run)
    digest = parameter_digest(run.model.trainable_variables)
    in_sync = parameters_in_sync(run, digest)
    log.info("final parameter digest %s (all workers identical: %s)", digest[:16], in_sync)
    if run.master:
        save_model(run.model, Path(run.args.out) / MODEL_FILE)
        write_metrics(run, status="complete", parameters_in_sync=in_sync, parameter_digest=digest, **memory)
        log.info("results in %s", Path(run.args.out).resolve())
    run.tracker.close()


def save_model(model: keras.Model, path: Path) -> None:
    """The model in Keras's format, atomically (Keras writes only to names that end in .keras)."""

    def write(tmp: Path) -> None:
        staged = tmp.with_name(tmp.name + ".keras")
        model.save(staged)
        os.replace(staged, tmp)

    checkpoint.write_atomic(path, write)


def memory_report(run: Run) -> dict:
    """Per rank: the parameters it holds, their bytes (with the batch-norm statistics), its peak memory and the
    part of that peak its training added."""
    params = sum(int(np.prod(v.shape)) for v in run.model.trainable_variables)
    held = sum(int(np.prod(v.shape)) * v.dtype.size for v in run.model.variables)
    peak = peak_memory_mb(run.device)
    added = peak if run.device != "cpu" else peak_resident_mb() - run.resident_before_model_mb
    return {
        "parameters_per_rank": [int(v) for v in rank_values(run, params)],
        "parameter_bytes_per_rank": [int(v) for v in rank_values(run, held)],
        "peak_memory_mb": rank_values(run, peak),
        "training_memory_mb": rank_values(run, added),
    }


def peak_memory_mb(device: str) -> float:
    """This process's peak memory: TensorFlow's peak allocation on the GPU, its own peak resident set on the CPU."""
    if device == "cpu":
        return peak_resident_mb()
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20


def write_metrics(run: Run, status: str, **extra) -> None:
    """Rank 0: metrics.json, rewritten after every epoch; status says whether the run is complete."""
    args, last = run.args, (run.history[-1] if run.history else {})
    summary = {
        "status": status,
        "framework": run.framework,
        "model": args.model,
        "data": str(args.data),
        "num_classes": len(run.images.classes),
        "world_size": run.worker.size,
        "backend": "horovod",
        "device": run.device,
        "precision": run.precision,
        "batch_size_per_worker": args.batch_size,
        "global_batch_size": args.batch_size * run.worker.size,
        "base_lr": args.lr,
        "peak_lr": args.lr * run.worker.size,
        "global_step": run.step,
        "resumed_from_steps": run.resumed_from,
        "wall_seconds": run.wall_seconds(),
        "final_val_top1": last.get("val_top1"),
        "final_val_top5": last.get("val_top5"),
        "images_per_sec": last.get("images_per_sec"),
        "data_wait_share": last.get("data_wait_share"),
        "steady_images_per_sec": last.get("steady_images_per_sec"),
        "versions": library_versions(),
        "cpu_ms_per_step": {
            "training_thread": last.get("training_thread_cpu_ms_per_step"),
            "other_threads": last.get("other_threads_cpu_ms_per_step"),
        },
        "trainer": str(Path(__file__).resolve().parents[1]),  # the training package: which scripts version
        "model_file": MODEL_FILE,
        **run.images.facts,
        "epochs": run.history,
        **extra,
    }
    checkpoint.save_json(Path(args.out) / "metrics.json", summary)


def library_versions() -> dict[str, str]:
    """Versions of what the run depends on."""
    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        **installed_versions("tf_keras", "horovod"),
    }
