"""Training of a ResNet with Keras (tf_keras): model.compile and model.fit, with Horovod's optimizer and callbacks.

One process (CPU or one GPU; Horovod makes a world of one without a launcher):
    python containers/trainer/tf/fit.py --data DATA --out OUT --model resnet18 --epochs 10

N processes on one machine:
    horovodrun -np 2 -H localhost:2 python containers/trainer/tf/fit.py --data DATA --out OUT

2 nodes with 4 GPUs each (OUT and DATA on storage both nodes mount):
    horovodrun -np 8 -H node0:4,node1:4 python containers/trainer/tf/fit.py --data DATA --out OUT

The checks alone, in one process (the orchestrator's preflight):
    python containers/trainer/tf/fit.py --data DATA --out OUT --check --check-workers 2 --verify-images

The same data, models, schedule, checkpoints and results as loop.py, the TensorFlow trainer (run.py is the adapter
they share, trainer/core.py the policies); here Keras runs the steps. Horovod's DistributedOptimizer, over a legacy
Keras optimizer (Horovod does not support Keras 3's), averages the gradients; its callbacks start every worker from
rank 0's variables and average the epoch's loss; this module's callbacks set the rate before each step (the loop's
rate at every step) and hand each step and each epoch's end to the loop's policies (core.after_step: progress and
checkpoints; core.end_epoch: validation, a checkpoint and metrics.json). A run resumed mid-epoch first fits the rest
of that epoch, then the epochs after it.
"""

import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `trainer` importable and checked, and trainer.tf imported first
    sys.pycache_prefix = sys.pycache_prefix or os.path.expanduser("~/.cache/trainflow/pycache")  # never a share's
    sys.path.insert(0, scripts := str(Path(__file__).resolve().parents[2]))
    from nodelib.scripts import exit_unless_intact

    exit_unless_intact(Path(scripts))  # before any other module of the package is imported
    import trainer.tf  # noqa: F401 - tf.keras is tf_keras (TF_USE_LEGACY_KERAS) before Horovod's modules read it

import horovod.tensorflow.keras as hvd
import tensorflow as tf
import tf_keras as keras

from trainer import core
from trainer.tf import data
from trainer.tf.run import TensorFlow, main, set_up
from trainer.throughput import Throughput


def train(args) -> None:
    """Set up this worker (resuming if OUT holds a checkpoint), fit every epoch, write the results."""
    run = set_up(args, "keras", wrap_optimizer=hvd.DistributedOptimizer)  # Horovod: averages the gradients
    adapter = run.adapter
    adapter.model.compile(
        optimizer=adapter.optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,  # Horovod's all-reduce has no XLA kernel here
    )
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # Horovod: rank 0's variables after the first step
        hvd.callbacks.MetricAverageCallback(),  # Horovod: the epoch's loss averaged over the workers
        StepRate(run),
        Progress(run),
    ]
    if run.skip_steps:  # resumed mid-epoch: the rest of that epoch, a fit of its own (its own steps per epoch)
        finish_epoch(run, callbacks)
    fit(run, callbacks, epochs=args.epochs - run.epoch, steps=adapter.steps)
    core.finish(run)


def finish_epoch(run: core.Run[TensorFlow], callbacks: list) -> None:
    """The steps left of the epoch a resumed run stopped in; none left (stopped between its last step and its end):
    its end alone, as the loop ends it."""
    steps = run.adapter.steps_per_epoch()
    if run.skip_steps < steps:
        fit(run, callbacks, epochs=1, steps=steps - run.skip_steps)
        return
    run.skip_steps = 0
    core.end_epoch(run, core.epoch_row(run, 0.0, Throughput(), measured_waits=False))


def fit(run: core.Run[TensorFlow], callbacks: list, epochs: int, steps: int) -> None:
    """model.fit over `epochs` epochs of `steps` steps from run.epoch (the first from its run.skip_steps-th step):
    each epoch's batches are the data module's for that epoch, in one dataset."""
    if epochs < 1:
        return
    adapter = run.adapter
    batches = epoch_batches(adapter, run.epoch, run.skip_steps)
    for epoch in range(run.epoch + 1, run.epoch + epochs):
        batches = batches.concatenate(epoch_batches(adapter, epoch, 0))
    try:
        adapter.model.fit(batches, epochs=epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
    except tf.errors.InvalidArgumentError as exc:  # an image that fails to decode: named, as the loop names it
        raise data.unreadable_image(exc) or exc from None


def epoch_batches(adapter: TensorFlow, epoch: int, skip: int):
    """This worker's batches of `epoch` from its `skip`-th step: exactly the steps left of it."""
    dataset = data.train_dataset(adapter.images, adapter.args, adapter.rank, adapter.world_size, epoch, skip)
    return dataset.take(adapter.steps - skip)


class StepRate(keras.callbacks.Callback):
    """The schedule's rate before every step, as the loop sets it (Horovod's LearningRateWarmupCallback ramps per
    epoch fraction and has no decay: the two trainers would not step at the same rates)."""

    def __init__(self, run: core.Run[TensorFlow]):
        super().__init__()
        self.run = run

    def on_train_batch_begin(self, batch, logs=None):
        self.run.adapter.set_rate(self.run.step)


class Progress(keras.callbacks.Callback):
    """Each step to core.after_step (progress every --log-every steps, a checkpoint every --checkpoint-every), each
    epoch's end to core.end_epoch (validation, a checkpoint, metrics.json)."""

    def __init__(self, run: core.Run[TensorFlow]):
        super().__init__()
        self.run = run
        self.done, self.counted, self.mean = 0, Throughput(), 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self.done, self.run.skip_steps = self.run.skip_steps, 0
        self.counted, self.mean = Throughput(), 0.0

    def on_train_batch_end(self, batch, logs=None):
        mean, k = float(logs["loss"]), batch + 1  # Keras's running mean of this fit epoch's k losses
        loss, self.mean = k * mean - (k - 1) * self.mean, mean  # so this step's own loss, as the loop prints
        self.done = core.after_step(self.run, self.done, loss, self.run.args.batch_size, self.counted)

    def on_epoch_end(self, epoch, logs=None):
        # after MetricAverageCallback: the loss is the mean over every worker's steps
        row = core.epoch_row(self.run, float(logs["loss"]) * self.counted.seen, self.counted, measured_waits=False)
        core.end_epoch(self.run, row)


if __name__ == "__main__":
    sys.exit(main(train, "fit.py"))
