"""A small Keras classifier under horovodrun (Horovod's Keras API over tf_keras), written as Horovod's Keras examples
are, with nothing of trainflow in it: an example of your own training script (docs/guides/own-script.md). It fits
random points to the quadrant they lie in, checkpoints every epoch into --checkpoint-dir and resumes from the newest,
and logs to TensorBoard under --log-dir (rank 0 alone).

    TF_USE_LEGACY_KERAS=1 horovodrun -np 2 -H localhost:2 --gloo python train.py --epochs 3
    trainflow run --script containers/examples/keras-horovod --framework keras --launcher horovodrun -- train.py \
        --epochs 3 --checkpoint-dir '${{checkpoints}}' --log-dir '${{logs}}/tb'
"""

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Horovod's Keras support needs tf_keras, not Keras 3

import horovod.tensorflow.keras as hvd
import numpy as np
import tf_keras as keras


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512, help="training points per worker")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--log-dir", type=Path, default=Path("logs"))
    return parser.parse_args()


def quadrants(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random points in [-1, 1]^2 and the quadrant (0-3) each lies in."""
    points = np.random.default_rng(seed).uniform(-1, 1, (samples, 2)).astype("float32")
    return points, ((points[:, 0] > 0) * 1 + (points[:, 1] > 0) * 2).astype("int64")


def newest_checkpoint(folder: Path) -> tuple[Path | None, int]:
    found = sorted(folder.glob("checkpoint-*.h5"), key=lambda p: int(p.stem.split("-")[1]))
    return (found[-1], int(found[-1].stem.split("-")[1])) if found else (None, 0)


def main() -> None:
    args = parse_args()
    hvd.init()
    x, y = quadrants(args.samples, seed=hvd.rank())
    model = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    # Horovod: scale the learning rate by the workers and average the gradients.
    optimizer = hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(args.lr * hvd.size(), momentum=0.9))
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.build((None, 2))
    checkpoint, start = newest_checkpoint(args.checkpoint_dir)
    if checkpoint:
        model.load_weights(checkpoint)
        if hvd.rank() == 0:
            print(f"resumed from {checkpoint.name} (epoch {start})")
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # Horovod: every worker starts from rank 0's weights
        hvd.callbacks.MetricAverageCallback(),  # Horovod: the epoch's metrics averaged over the workers
    ]
    if hvd.rank() == 0:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        callbacks += [
            keras.callbacks.ModelCheckpoint(str(args.checkpoint_dir / "checkpoint-{epoch}.h5"), save_weights_only=True),
            keras.callbacks.TensorBoard(str(args.log_dir)),
        ]
    model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        initial_epoch=start,
        callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,
    )
    print(f"rank {hvd.rank()} of {hvd.size()} done", flush=True)


if __name__ == "__main__":
    main()
