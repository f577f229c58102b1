"""Experiment tracking from the engine: the rank that reports the loss logs its metrics into an MLflow run, and into
TensorBoard event files, while it trains, when asked to.

Off unless --tracking-uri is given (nothing is imported then: the engine runs without MLflow). The orchestrator
makes one MLflow run per pipeline run and passes its id (--tracking-run-id); run alone, the engine makes a run of
its own in the experiment "trainflow" and ends it when training ends. Metrics are logged against the global step,
so the per-step and the per-epoch series share one axis. --tensorboard DIR writes the same series as event files
under DIR/<--out's name> (`tensorboard --logdir DIR` shows every run there side by side).
"""

import importlib.util
import time
from pathlib import Path

from nodelib.errors import UsageError

EXPERIMENT = "trainflow"  # where a run the engine makes itself is filed
MLFLOW_PIN = "mlflow-skinny==3.17.2"  # what the images install (containers/requirements/image.txt)
TENSORBOARD_PIN = "tensorboard==2.21.0"  # pyproject.toml's


def check_trackers(uri: str, tensorboard: str) -> None:
    """Refuse a tracking URI where MLflow cannot be imported, or event files without TensorBoard, before any worker
    starts."""
    if uri and importlib.util.find_spec("mlflow") is None:
        raise UsageError(
            f"--tracking-uri {uri} needs MLflow in the engine's Python, which lacks it: pip install "
            f"{MLFLOW_PIN}, or leave --tracking-uri out to train without tracking"
        )
    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise UsageError(
            f"--tensorboard {tensorboard} needs TensorBoard in the engine's Python, which lacks it: pip "
            f"install {TENSORBOARD_PIN}, or leave --tensorboard out"
        )


class Tracker:
    """Metrics of one rank to an MLflow run and to TensorBoard event files, each where asked for; does nothing when
    tracking is off or on the ranks that do not log."""

    def __init__(self, client=None, run_id: str = "", owned: bool = False, writer=None):
        self.client, self.run_id, self.owned, self.writer = client, run_id, owned, writer

    def log(self, values: dict, step: int) -> None:
        """Log every value that is a number, at global step `step`."""
        numbers = {key: float(v) for key, v in values.items() if isinstance(v, (int, float))}
        if self.client is not None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self.client.log_batch(self.run_id, metrics=[Metric(key, v, now, step) for key, v in numbers.items()])
        if self.writer is not None:
            for key, v in numbers.items():
                self.writer.add_scalar(key, v, step)

    def close(self) -> None:
        """Flush the event files; end the MLflow run if the engine made it (the orchestrator ends its own)."""
        if self.writer is not None:
            self.writer.close()
        if self.client is not None and self.owned:
            self.client.set_terminated(self.run_id)


def open_tracker(args, logs: bool) -> Tracker:
    """The Tracker that --tracking-uri, --tracking-run-id and --tensorboard ask for if `logs`, else one that does
    nothing."""
    if not logs:
        return Tracker()
    check_trackers(args.tracking_uri, args.tensorboard)
    writer = None
    if args.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(Path(args.tensorboard) / Path(args.out).name))
    if not args.tracking_uri:
        return Tracker(writer=writer)
    client, run_id, owned = open_mlflow_run(args.tracking_uri, args.tracking_run_id, vars(args))
    return Tracker(client, run_id, owned, writer)


def open_mlflow_run(uri: str, run_id: str, params: dict):
    """(client, run id, whether the engine made the run): run `run_id` on `uri`, or a new run of the engine's own,
    with `params`, when it is empty."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    if run_id:
        return client, run_id, False
    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
    run = client.create_run(experiment_id, tags={"mlflow.source.name": "trainer/train.py"})
    from mlflow.entities import Param

    client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in params.items()])
    return client, run.info.run_id, True


def step_metrics(loss: float, lr: float, images_per_sec: float) -> dict:
    """What is logged every --log-every steps."""
    return {"loss": loss, "lr": lr, "images_per_sec": images_per_sec}


def epoch_metrics(row: dict) -> dict:
    """What is logged at each epoch's end: its loss, accuracy, throughput and each rank's data-wait share (and the
    highest, the rank that waits most: every step waits for the slowest)."""
    shares = row.get("data_wait_share") or []
    per_rank = {f"data_wait_share/rank{rank}": share for rank, share in enumerate(shares)}
    return {
        "epoch": row["epoch"],
        "epoch_train_loss": row["train_loss"],
        "val_loss": row.get("val_loss"),
        "val_top1": row.get("val_top1"),
        "val_top5": row.get("val_top5"),
        "epoch_images_per_sec": row["images_per_sec"],
        "data_wait_share": max(shares, default=None),
        **per_rank,
    }
