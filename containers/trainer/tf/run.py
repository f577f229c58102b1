"""The TensorFlow and Keras trainers' adapter to the training loop (trainer/core.py): the worker under Horovod, the
model and optimizer, one step, validation, checkpoints (tf/checkpoints.py), the model file and the collectives. The
loop (loop.py) and Keras's fit (fit.py) use the same adapter and the same policies.

The output is every trainer's (nodelib/records.py) and rank 0 writes metrics.json with the same fields. The choices
that make the two frameworks train alike:

- SGD as torch.optim.SGD computes it (`TorchSGD`): v = momentum * v + (g + weight_decay * w); w -= lr * v. Weight
  decay is coupled, added to the averaged gradient of every trainable variable (kernels, biases and batch-norm
  scales and offsets, as train.py decays all of model.parameters()), not an L2 term in the loss: the loss
  reported is the cross-entropy alone, and a change of rate does not rescale the momentum as Keras's SGD does.
- The rate is lr x workers after a linear warmup from lr, then cosine or step decay (trainer/schedule.py), set
  before each step from the global step, by both trainers.
- Batch-norm statistics are averaged over the workers at each epoch's end (each saw its own batches).

A run started again with the same OUT resumes from the newest checkpoint at its exact step, mid-epoch included, and
ends with the parameters of a run that was never interrupted. The model is OUT/model.keras (Keras's own format:
`tf_keras.models.load_model` reads it).
"""

import functools
import hashlib
import logging
import os
import platform
import socket
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
import tf_keras as keras

from nodelib.errors import UsageError
from trainer import checkpoint, console, core, model_files, tracking
from trainer.memory import peak_resident_mb, resident_mb
from trainer.options import check_output_folder, cores_per_process
from trainer.tf import checkpoints, data, models
from trainer.tf.options import build_parser, check_args
from trainer.throughput import installed_versions

log = logging.getLogger("trainer")
MODEL_FILE = "model.keras"


@dataclass
class TensorFlow:
    """The loop's Adapter for one Horovod worker, in either trainer."""

    args: Namespace
    framework: str  # "tensorflow" (loop.py) or "keras" (fit.py)
    rank: int
    world_size: int
    device: str  # "cpu" or "cuda:<n>", as train.py names it
    precision: str  # "bf16" or "fp32"
    images: data.Images
    steps: int  # steps of one full epoch
    model: keras.Model
    optimizer: keras.optimizers.legacy.Optimizer
    learning_rate: Callable[[int], float]  # the rate of a step: the run's schedule (core.rate_at)
    resident_before_model_mb: float = 0.0
    step_fn: Callable = lambda images, labels: None  # loop.py's tf.function step (make_train_step); fit.py's: Keras's
    evaluate_batch: Callable | None = None  # the tf.function that scores a val batch, made once

    @property
    def backend(self) -> str:
        return "horovod"

    @property
    def model_file(self) -> str:
        return MODEL_FILE

    @property
    def replicas(self) -> int:
        return self.world_size

    @property
    def reports_loss(self) -> bool:
        return self.rank == 0

    def sum(self, values: list[float]) -> list[float]:
        # Horovod: float64, summed over the workers; one name per length (the same collective on every rank)
        total = hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum, name=f"trainflow_sum_{len(values)}")
        return total.numpy().tolist()

    def sum_over_replicas(self, values: list[float]) -> list[float]:
        return self.sum(values)

    def steps_per_epoch(self) -> int:
        return self.steps

    def epoch_batches(self, epoch: int, skip: int):
        return data.batches(data.train_dataset(self.images, self.args, self.rank, self.world_size, epoch, skip))

    def set_rate(self, step: int) -> None:
        """The schedule's rate for step `step`, in the optimizer."""
        self.optimizer.learning_rate = self.learning_rate(step)

    def train_step(self, batch, step: int):
        images, labels = batch
        self.set_rate(step)
        return self.step_fn(images, labels), len(labels)  # the loss stays a tensor: no wait for its value

    def add_loss(self, total, loss, images: int):
        return loss * images if total is None else total + loss * images

    def average_statistics(self) -> None:
        stats = [v for v in self.model.non_trainable_variables if v.dtype.is_floating]
        if self.world_size == 1 or not stats:
            return
        flat = tf.concat([tf.reshape(v, [-1]) for v in stats], axis=0)
        flat = hvd.allreduce(flat, op=hvd.Average, name="trainflow_batch_norm")  # Horovod:
        offset = 0
        for v in stats:
            v.assign(tf.reshape(flat[offset : offset + int(np.prod(v.shape))], v.shape))
            offset += int(np.prod(v.shape))

    def evaluate(self) -> list[float] | None:
        if self.images.val is None:
            return None
        if self.evaluate_batch is None:
            self.evaluate_batch = make_evaluate_batch(self.model, len(self.images.classes))
        sums = np.zeros(4)  # loss, top-1 hits, top-5 hits, images
        for images, labels in data.batches(data.val_dataset(self.images, self.args, self.rank, self.world_size)):
            sums += self.evaluate_batch(images, labels).numpy()
        return sums.tolist()

    def variables(self) -> dict[str, list]:
        return {"model": self.model.variables, "optimizer": self.optimizer.variables()}

    def save_checkpoint(self, progress: dict, step: int) -> None:
        if self.rank == 0:
            folder = core.checkpoints_folder(self.args)
            checkpoints.save(folder, step, self.variables(), progress, self.args.keep_checkpoints)

    def resume(self) -> tuple[dict, str] | None:
        """Load the newest checkpoint in OUT into the model and the optimizer: (its progress, its name), or None."""
        found = checkpoints.list_checkpoints(core.checkpoints_folder(self.args))
        if not found:
            return None
        variables = self.variables()
        with np.load(found[-1]) as saved:
            progress = checkpoints.progress_of(saved)
            mine = [tuple(v.shape) for part in ("model", "optimizer") for v in variables[part]]
            theirs = checkpoints.part_shapes(saved, "model") + checkpoints.part_shapes(saved, "optimizer")
            core.check_resumable(progress, self.args.model, self.images.classes, self.args.out, mine == theirs)
            for part, values in variables.items():
                for i, v in enumerate(values):
                    v.assign(saved[f"{part}/{i}"])
        return progress, found[-1].name

    def digest(self) -> str:
        return parameter_digest(self.model.trainable_variables)

    def memory(self) -> tuple[int, int, float, float]:
        params = sum(int(np.prod(v.shape)) for v in self.model.trainable_variables)
        held = sum(int(np.prod(v.shape)) * v.dtype.size for v in self.model.variables)
        peak = peak_memory_mb(self.device)
        return params, held, peak, peak if self.device != "cpu" else peak_resident_mb() - self.resident_before_model_mb

    def save_model(self, out: Path, classes: list[str]) -> str:
        if self.rank == 0:
            save_model(self.model, out / MODEL_FILE, {"arch": self.args.model, "classes": classes})
        return self.digest()

    def versions(self) -> dict[str, str]:
        libraries = installed_versions("tf_keras", "horovod")
        return {"python": platform.python_version(), "tensorflow": tf.__version__, **libraries}

    def results(self) -> dict:
        return {}

    def close(self) -> None:
        """Horovod stays up until the process ends."""


def parameter_digest(variables: list) -> str:
    """SHA-256 of every (name, value) of `variables` (the trainable ones: batch-norm statistics are not
    parameters, as in the PyTorch trainer's digest)."""
    h = hashlib.sha256()
    for v in variables:
        h.update(v.name.encode())
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()


def main(train: Callable, prog: str, argv: list[str] | None = None) -> int:
    """Parse the arguments, check them (--check: only that) or `train`; bad input is one line and exit status 2."""
    return console.run_main(build_parser(prog).parse_args(argv), check_args, check_only, train)


def check_only(args) -> int:
    """The preflight (core.check_only), in one process, without Horovod."""
    core.check_only(args, CHECKS, args.check_workers)
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


def load_start(args, classes: list[str]) -> dict:
    """--init-from's weights loaded into a fresh model for `classes` (the preflight's check of them)."""
    with tf.device("/CPU:0"):
        model = models.build_model(args.model, len(classes), args.image_size, args.seed)
        return models.start_from(model, args.init_from, args.model, classes)


CHECKS = core.Checks(models.check_model_name, checkpoints.newest_progress, try_one_step, load_start)


def start_worker(args, framework: str) -> tuple[int, int, int, str, str]:
    """Join the Horovod workers (one process without a launcher is a world of one), share the cores, pick the
    device and the precision; (rank, size, local rank, device, precision)."""
    hvd.init()  # Horovod:
    rank, size, local_rank, local_size = hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()
    console.setup_logging(rank)
    threads = args.threads or cores_per_process(local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)  # before TensorFlow's runtime starts
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    device = pick_device(args.device, local_rank)
    precision = ("bf16" if device != "cpu" else "fp32") if args.precision == "auto" else args.precision
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if precision == "bf16" else "float32")
    host = socket.gethostname()
    log.info("worker %d of %d (horovod, %s) on host %s, %s, %d threads", rank, size, framework, host, device, threads)
    return rank, size, local_rank, device, precision


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


def set_up(args, framework: str, wrap_optimizer: Callable = lambda optimizer: optimizer) -> core.Run[TensorFlow]:
    """Start the worker, load the data, build the model and the optimizer (through `wrap_optimizer`: Horovod's
    DistributedOptimizer for fit), resume from the newest checkpoint in OUT, and start every worker from rank 0's
    variables."""
    rank, size, _, device, precision = start_worker(args, framework)
    tf.random.set_seed(args.seed)
    if rank == 0:
        check_output_folder(args.out)
    models.check_model_name(args.model)
    images = data.load(args, Path(args.out), rank, size)
    steps = data.steps_per_epoch(images, args, size)
    before_model = resident_mb()
    keras.backend.clear_session()  # layer names as in a fresh process: the parameter digest names them
    model = models.build_model(args.model, len(images.classes), args.image_size, args.seed)
    optimizer = wrap_optimizer(TorchSGD(args.lr, args.momentum, args.weight_decay))
    optimizer._create_all_weights(model.trainable_variables)  # momentum slots now: to restore and broadcast
    schedule = core.make_schedule(args, steps, size)
    rate = functools.partial(core.rate_at, args, schedule)
    adapter = TensorFlow(
        args, framework, rank, size, device, precision, images, steps, model, optimizer, rate, before_model
    )
    run = core.Run(args, adapter, images.classes, images.facts, schedule)
    if (found := adapter.resume()) is not None:
        core.restore(run, *found)
    elif args.init_from:  # rank 0's loaded weights reach every worker by the broadcast below
        loaded = models.start_from(model, args.init_from, args.model, images.classes)
        images.facts["init_from"] = console.started_from(loaded) if rank == 0 else loaded
    # Horovod: every worker starts from rank 0's model and optimizer state (a resumed one, or its initialisation)
    hvd.broadcast_variables(model.variables + optimizer.variables(), root_rank=0)
    run.tracker = open_tracker(args, rank == 0)
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


def save_model(model: keras.Model, path: Path, about: dict) -> None:
    """The model in Keras's format, atomically (Keras writes only to names that end in .keras), with `about` (its
    architecture and class names, which Keras's format does not hold) beside Keras's files in the zip."""

    def write(tmp: Path) -> None:
        staged = tmp.with_name(tmp.name + ".keras")
        model.save(staged)
        model_files.add_about(staged, about)
        os.replace(staged, tmp)

    checkpoint.write_atomic(path, write)


def peak_memory_mb(device: str) -> float:
    """This process's peak memory: TensorFlow's peak allocation on the GPU, its own peak resident set on the CPU."""
    if device == "cpu":
        return peak_resident_mb()
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
