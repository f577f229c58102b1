"""What every framework's trainer prints and how it exits (the trainer contract, infra/engines/contract.py): each
line starts with `[rank N]`, bad input is one `ERROR error: MESSAGE` line and exit status 2, anything unexpected a
traceback and exit status 1. Torch-free: the TensorFlow trainers use it too."""

import logging
import os
import re
import sys
from argparse import Namespace
from collections.abc import Callable

from trainer import tracking
from trainer.errors import DiskFull, UsageError
from trainer.tracking import Tracker

log = logging.getLogger("trainer")


def run_main(
    args: Namespace,
    check: Callable[[Namespace], None],
    check_only: Callable[[Namespace], int],
    train: Callable[[Namespace], None],
    refused: Callable[[], None] = lambda: None,
) -> int:
    """Check the arguments, then only the rest of the checks (--check) or train; the exit status. `refused` runs
    after a refusal (leave the process group, so that every rank that refuses exits 2 and none aborts)."""
    setup_logging(rank_from_env())
    try:
        check(args)
        if args.check:
            return check_only(args)
        train(args)
        return 0
    except UsageError as exc:
        log.error("error: %s", one_line(exc))
        refused()
        return 2
    except DiskFull as exc:  # a fault, not bad input: the newest checkpoint is whole, a re-run resumes from it
        log.error("error: %s", exc)
        return 1
    except Exception as exc:
        log.exception("error: unexpected %s: %s", type(exc).__name__, exc)
        return 1


def one_line(exc: Exception) -> str:
    """The message of a UsageError, also when a loader's worker re-raised it inside its own text."""
    text = str(exc).strip().splitlines()[-1]
    return re.sub(r"^(\w+\.)*(UsageError|BadImage): ", "", text)  # its class named by a worker's traceback


def rank_from_env() -> int:
    """The global rank, as far as the launcher's environment tells before the distributed backend starts."""
    for name in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def setup_logging(rank: int) -> None:
    """Every line starts with the worker's rank."""
    logging.basicConfig(
        level=logging.INFO,
        force=True,
        stream=sys.stdout,
        format=f"[rank {rank}] %(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )


def progress(tracker: Tracker, epoch: int, step: int, done: int, steps: int, loss: float, lr: float, rate: float):
    """The progress line every --log-every steps (PROGRESS_LINE: epoch from 1, global step, the step in the epoch of
    its steps, the loss, the learning rate, images/s) and the step's metrics to the tracker."""
    log.info("epoch %d step %d (%d/%d) loss %.4f lr %.5f, %.1f images/s", epoch, step, done, steps, loss, lr, rate)
    tracker.log(tracking.step_metrics(loss, lr, rate), step)


def epoch_done(row: dict, epochs: int) -> None:
    """Rank 0's line at an epoch's end."""
    top1 = "n/a" if row["val_top1"] is None else f"{row['val_top1']:.4f}"
    log.info(
        "epoch %d/%d done: train loss %.4f, val top-1 %s, %.1f images/s (%.1f per worker)",
        row["epoch"],
        epochs,
        row["train_loss"],
        top1,
        row["images_per_sec"],
        row["images_per_sec_per_worker"],
    )
