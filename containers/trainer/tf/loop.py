"""Training of a ResNet with TensorFlow: a custom loop (a tf.function step, Horovod's DistributedGradientTape).

One process (CPU or one GPU; Horovod makes a world of one without a launcher):
    python containers/trainer/tf/loop.py --data DATA --out OUT --model resnet18 --epochs 10

N processes on one machine:
    horovodrun -np 2 -H localhost:2 python containers/trainer/tf/loop.py --data DATA --out OUT

2 nodes with 4 GPUs each (OUT and DATA on storage both nodes mount):
    horovodrun -np 8 -H node0:4,node1:4 python containers/trainer/tf/loop.py --data DATA --out OUT

The checks alone, in one process (the orchestrator's preflight):
    python containers/trainer/tf/loop.py --data DATA --out OUT --check --check-workers 2 --verify-images

DATA is an ImageNet-layout folder (train/<class>/..., val/<class>/...) or the word "synthetic". Each step every
worker computes the gradient of its own batch, Horovod averages them (the `# Horovod:` lines), and every worker
applies the same update. Rank 0 alone writes OUT: checkpoints/ (every --checkpoint-every steps and at each epoch
end), metrics.json and model.keras; a run started again with the same OUT resumes from its newest checkpoint at
its exact step (run.py says how, and what the loop shares with fit.py, the Keras trainer). Bad input exits with
status 2 and a one-line message. Run with --help for every option.
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

import horovod.tensorflow as hvd
import tensorflow as tf
import tf_keras as keras

from trainer.tf import data
from trainer.tf.run import Run, Throughput, end_epoch, epoch_row, finish, log_step, main, save_checkpoint, set_up
from trainer.tf.run import set_learning_rate as set_rate


def train(args) -> None:
    """Set up this worker (resuming if OUT holds a checkpoint), train every epoch, write the results."""
    run = set_up(args, "tensorflow")
    step = make_train_step(run)
    while run.epoch < args.epochs:
        end_epoch(run, train_epoch(run, step))
    finish(run)


def make_train_step(run: Run):
    """The training step as one tf.function: forward, backward, gradients averaged over the workers, SGD update;
    returns the batch's mean loss."""
    model, optimizer = run.model, run.optimizer
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = cross_entropy(labels, tf.cast(model(images, training=True), tf.float32))
        tape = hvd.DistributedGradientTape(tape)  # Horovod: gradient() returns the workers' average
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def train_epoch(run: Run, step) -> dict:
    """One epoch of synchronous SGD from its first step not yet done; its row of metrics.json."""
    args = run.args
    done, run.skip_steps = run.skip_steps, 0
    batches = data.batches(data.train_dataset(run.images, args, run.worker.rank, run.worker.size, run.epoch, done))
    counted, losses = Throughput(), []
    while done < run.steps and (batch := counted.next_batch(batches)) is not None:
        images, labels = batch
        set_rate(run)
        loss = step(images, labels)  # stays a tensor: no wait for the value but every --log-every steps
        done, run.step = done + 1, run.step + 1
        if args.checkpoint_every and run.step % args.checkpoint_every == 0:
            save_checkpoint(run, step_in_epoch=done)
        losses.append(loss * len(labels))
        counted.count(len(labels))
        if run.master and run.step % args.log_every == 0:
            log_step(run, done, float(loss), counted)
    loss_sum = float(tf.add_n(losses)) if losses else 0.0  # waits for the last step: then the epoch's time is up
    return epoch_row(run, loss_sum, counted)


if __name__ == "__main__":
    sys.exit(main(train, "loop.py"))
