"""What every framework's trainer prints and how it exits (the contract of nodelib/records.py): each line starts
with `[rank N]`; the events the orchestrator reads (progress, checkpoints, failures) are lines of their own beside
the log for people; bad input is one `ERROR error: MESSAGE` line (and its `Failure` event) and exit status 2, a
fault one such line and exit status 1, anything unexpected a traceback and exit status 1. Torch-free: the
TensorFlow trainers use it too."""

import logging
import os
import re
import sys
from argparse import Namespace
from collections.abc import Callable

from nodelib.errors import DiskFull, UsageError
from nodelib.records import EpochRow, Event, Failure, Progress, event_line, rank_prefix
from trainer import tracking
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
        fail(Failure(one_line(exc)))
        refused()
        return 2
    except DiskFull as exc:  # a fault, not bad input: the newest checkpoint is whole, a re-run resumes from it
        fail(Failure(str(exc), "fault"))
        return 1
    except Exception as exc:
        fail(Failure(f"unexpected {type(exc).__name__}: {exc}", "unexpected"))
        return 1


def fail(failure: Failure) -> None:
    """The error line for people (with the traceback when it is unexpected) and its event."""
    log.error("error: %s", failure.message, exc_info=failure.cause == "unexpected")
    event(failure)


def event(record: Event) -> None:
    """An event for the orchestrator, on a line of its own."""
    log.info("%s", event_line(record))


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
        format=f"{rank_prefix(rank)}%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )


def progress(tracker: Tracker, p: Progress) -> None:
    """The progress line every --log-every steps (epoch from 1, global step, the step in the epoch of its steps, the
    loss, the learning rate, images/s), its event, and the step's metrics to the tracker."""
    log.info(
        "epoch %d step %d (%d/%d) loss %.4f lr %.5f, %.1f images/s",
        p.epoch,
        p.step,
        p.step_in_epoch,
        p.steps_per_epoch,
        p.loss,
        p.lr,
        p.images_per_sec,
    )
    event(p)
    tracker.log(tracking.step_metrics(p.loss, p.lr, p.images_per_sec), p.step)


def epoch_done(row: EpochRow, epochs: int) -> None:
    """Rank 0's line at an epoch's end."""
    top1 = "n/a" if row.val_top1 is None else f"{row.val_top1:.4f}"
    log.info(
        "epoch %d/%d done: train loss %.4f, val top-1 %s, %.1f images/s (%.1f per worker)",
        row.epoch,
        epochs,
        row.train_loss,
        top1,
        row.images_per_sec,
        row.images_per_sec_per_worker,
    )


def started_from(loaded: dict) -> dict:
    """Log what --init-from loaded and what the model has anew; `loaded` as metrics.json records it."""
    new = ", ".join(loaded["new"]) or "none"
    log.info(
        "starting from %s: %d of %d tensors loaded; new: %s", loaded["source"], loaded["loaded"], loaded["tensors"], new
    )
    return loaded
