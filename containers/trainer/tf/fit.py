"""Training of a ResNet with Keras (tf_keras): model.compile and model.fit, with Horovod's optimizer and callbacks.

One process (CPU or one GPU; Horovod makes a world of one without a launcher):
    python containers/trainer/tf/fit.py --data DATA --out OUT --model resnet18 --epochs 10

N processes on one machine:
    horovodrun -np 2 -H localhost:2 python containers/trainer/tf/fit.py --data DATA --out OUT

2 nodes with 4 GPUs each (OUT and DATA on storage both nodes mount):
    horovodrun -np 8 -H node0:4,node1:4 python containers/trainer/tf/fit.py --data DATA --out OUT

The checks alone, in one process (the orchestrator's preflight):
    python containers/trainer/tf/fit.py --data DATA --out OUT --check --check-workers 2 --verify-images

The same data, models, schedule, checkpoints and results as loop.py, the TensorFlow trainer (run.py holds what they
share); here Keras runs the steps. Horovod's DistributedOptimizer, over a legacy Keras optimizer (Horovod does not
support Keras 3's), averages the gradients; its callbacks start every worker from rank 0's variables and average the
epoch's loss; this module's callbacks set the rate before each step (the loop's rate at every step), print the
progress lines, checkpoint every --checkpoint-every steps, and at each epoch's end validate, checkpoint and rewrite
metrics.json. A run resumed mid-epoch first fits the rest of that epoch, then the epochs after it.
"""

import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `trainer` importable and checked, and trainer.tf imported first
    sys.pycache_prefix = sys.pycache_prefix or os.path.expanduser("~/.cache/trainflow/pycache")  # never a share's
    sys.path.insert(0, scripts := str(Path(__file__).resolve().parents[2]))
    from trainer.scripts import exit_unless_intact

    exit_unless_intact(Path(scripts))  # before any other module of the package is imported
    import trainer.tf  # noqa: F401 - tf.keras is tf_keras (TF_USE_LEGACY_KERAS) before Horovod's modules read it

import horovod.tensorflow.keras as hvd
import tensorflow as tf
import tf_keras as keras

from trainer.tf import data
from trainer.tf.run import Run, Throughput, end_epoch, epoch_row, finish, log_step, main, save_checkpoint, set_up
from trainer.tf.run import set_learning_rate as set_rate


def train(args) -> None:
    """Set up this worker (resuming if OUT holds a checkpoint), fit every epoch, write the results."""
    run = set_up(args, "keras", wrap_optimizer=hvd.DistributedOptimizer)  # Horovod: averages the gradients
    run.model.compile(
        optimizer=run.optimizer,
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
    fit(run, callbacks, epochs=args.epochs - run.epoch, steps=run.steps)
    finish(run)


def finish_epoch(run: Run, callbacks: list) -> None:
    """The steps left of the epoch a resumed run stopped in; none left (stopped between its last step and its end):
    its end alone, as the loop ends it."""
    if run.skip_steps < run.steps:
        fit(run, callbacks, epochs=1, steps=run.steps - run.skip_steps)
        return
    run.skip_steps = 0
    end_epoch(run, epoch_row(run, 0.0, Throughput(), measured_waits=False))


def fit(run: Run, callbacks: list, epochs: int, steps: int) -> None:
    """model.fit over `epochs` epochs of `steps` steps from run.epoch (the first from its run.skip_steps-th step):
    each epoch's batches are the data module's for that epoch, in one dataset."""
    if epochs < 1:
        return
    batches = epoch_batches(run, run.epoch, run.skip_steps)
    for epoch in range(run.epoch + 1, run.epoch + epochs):
        batches = batches.concatenate(epoch_batches(run, epoch, 0))
    try:
        run.model.fit(batches, epochs=epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
    except tf.errors.InvalidArgumentError as exc:  # an image that fails to decode: named, as the loop names it
        raise data.unreadable_image(exc) or exc from None


def epoch_batches(run: Run, epoch: int, skip: int):
    """This worker's batches of `epoch` from its `skip`-th step: exactly the steps left of it."""
    args, worker = run.args, run.worker
    return data.train_dataset(run.images, args, worker.rank, worker.size, epoch, skip).take(run.steps - skip)


class StepRate(keras.callbacks.Callback):
    """The schedule's rate before every step, as loop.py sets it (Horovod's LearningRateWarmupCallback ramps per
    epoch fraction and has no decay: the two trainers would not step at the same rates)."""

    def __init__(self, run: Run):
        super().__init__()
        self.run = run

    def on_train_batch_begin(self, batch, logs=None):
        set_rate(self.run)


class Progress(keras.callbacks.Callback):
    """Counts the steps; prints the progress line every --log-every steps, checkpoints every --checkpoint-every
    steps, and at each epoch's end validates, checkpoints and rewrites metrics.json (run.end_epoch)."""

    def __init__(self, run: Run):
        super().__init__()
        self.run = run
        self.done, self.counted, self.mean = 0, Throughput(), 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self.done, self.run.skip_steps = self.run.skip_steps, 0
        self.counted, self.mean = Throughput(), 0.0

    def on_train_batch_end(self, batch, logs=None):
        run, args = self.run, self.run.args
        self.done, run.step = self.done + 1, run.step + 1
        self.counted.count(args.batch_size)
        if args.checkpoint_every and run.step % args.checkpoint_every == 0:
            save_checkpoint(run, step_in_epoch=self.done)
        mean, k = float(logs["loss"]), batch + 1  # Keras's running mean of this fit epoch's k losses
        loss, self.mean = k * mean - (k - 1) * self.mean, mean  # so this step's own loss, as train.py prints
        if run.master and run.step % args.log_every == 0:
            log_step(run, self.done, loss, self.counted)

    def on_epoch_end(self, epoch, logs=None):
        # after MetricAverageCallback: the loss is the mean over every worker's steps
        row = epoch_row(self.run, float(logs["loss"]) * self.counted.seen, self.counted, measured_waits=False)
        end_epoch(self.run, row)


if __name__ == "__main__":
    sys.exit(main(train, "fit.py"))
