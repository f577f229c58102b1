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
its exact step. trainer/core.py runs the loop, with run.py's adapter (which fit.py, the Keras trainer, shares) and
this module's step. Bad input exits with status 2 and a one-line message. Run with --help for every option.
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

import horovod.tensorflow as hvd
import tensorflow as tf
import tf_keras as keras

from trainer import core
from trainer.tf.run import TensorFlow, main, set_up


def train(args) -> None:
    """Set up this worker (resuming if OUT holds a checkpoint), train every epoch, write the results (core.train)."""
    run = set_up(args, "tensorflow")
    run.adapter.step_fn = make_train_step(run.adapter)
    core.train(run)


def make_train_step(adapter: TensorFlow):
    """The training step as one tf.function: forward, backward, gradients averaged over the workers, SGD update;
    returns the batch's mean loss."""
    model, optimizer = adapter.model, adapter.optimizer
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


if __name__ == "__main__":
    sys.exit(main(train, "loop.py"))
