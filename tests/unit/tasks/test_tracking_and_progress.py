"""The pure parts of experiment tracking, live progress and the data-wait share: the share as measured around a
real loader's waits, the ETA, the progress line read as the engine writes it, what the flow tells the engine, and
the engine's one-line refusal of a tracking URI without MLflow."""

import subprocess
import sys
import threading
import time

import pytest

from flows.report import data_wait_lines, tracking_lines
from infra.engines.contract import PACKAGE
from infra.engines.pytorch import PyTorchTraining
from infra.runs.tracking import TrackingConfig, client, engine_uri, flat, run_page, start_run, store_uri
from nodelib.records import Checkpointed, Failure, Progress, read_event
from tasks.progress import eta_seconds, eta_text, progress_markdown, read_step
from tasks.track_run import ended_if_unfinished, tracked_training
from trainer.metrics import Throughput, wait_share
from trainer.tracking import epoch_metrics

EVENT = Progress(epoch=2, step=30, step_in_epoch=10, steps_per_epoch=20, loss=0.4123, lr=0.05, images_per_sec=123.4)


def slow_batches(n: int, seconds: float):
    for i in range(n):
        time.sleep(seconds)
        yield i


def test_the_data_wait_share_counts_the_time_spent_in_the_loader():
    counted, batches = Throughput(), slow_batches(4, 0.05)
    while counted.next_batch(batches) is not None:
        time.sleep(0.05)  # the step's compute, as long as the wait
    assert counted.waited >= 0.2 and 0.35 < counted.data_wait_share() < 0.65
    assert wait_share(1.0, 4.0) == 0.25 and wait_share(0.0, 0.0) == 0.0 and wait_share(5.0, 4.0) == 1.0


def busy(cpu_seconds: float) -> None:
    """Burn this thread's own CPU for `cpu_seconds`."""
    until = time.thread_time() + cpu_seconds
    while time.thread_time() < until:
        pass


def test_the_cpu_per_step_splits_the_training_thread_from_the_others():
    """Two steps after the first: the counting thread burns 0.1 s of CPU and another thread (the all-reduce's, in a
    training) 0.2 s; per step, 50 and 100 ms. The first step's CPU is not counted."""
    counted = Throughput()
    assert counted.cpu_ms_per_step() == (0.0, 0.0)
    busy(0.1)
    counted.count(8)
    assert counted.cpu_ms_per_step() == (0.0, 0.0)  # one step: nothing steady yet
    other = threading.Thread(target=busy, args=(0.2,))
    other.start()
    busy(0.1)
    other.join()
    counted.count(8)
    counted.count(8)
    training, others = counted.cpu_ms_per_step()
    assert 50 <= training < 65 and 100 <= others < 115


def test_the_progress_event_gives_the_step_of_all_and_the_eta_follows_the_pace():
    seen = read_step(EVENT, epochs=3)
    assert (seen.epoch, seen.step, seen.total, seen.images_per_sec) == (2, 30, 60, 123.4) and seen.percent == 50.0
    assert read_step(Checkpointed(30), 3) is None
    assert eta_seconds((100.0, 10), 100.0, 10, 60) is None  # no pace before a step has passed
    assert eta_seconds((100.0, 10), 110.0, 30, 60) == 15.0  # 20 steps in 10 s, 30 to go
    assert [eta_text(s) for s in (None, 12.4, 250, 3900)] == ["measuring", "12 s", "4 min 10 s", "1 h 05 min"]
    assert progress_markdown(seen, 15.0) == "**training**: epoch 2/3, step 30/60, 123.4 images/s, ETA 15 s"


def test_the_engine_logs_where_it_reaches_the_store_and_the_flow_hands_it_the_run(tmp_path):
    uri = store_uri(TrackingConfig(), tmp_path)
    assert (
        uri == f"sqlite:///{tmp_path}/mlflow/mlflow.db"
        and store_uri(TrackingConfig(uri="http://m:5000"), tmp_path) == "http://m:5000"
    )
    assert engine_uri(uri, in_image=False) == uri and engine_uri(uri, in_image=True) == ""
    assert engine_uri("azureml://x", in_image=True) == "azureml://x"
    training = PyTorchTraining()
    assert "--tracking-uri" not in training.trainer_args()  # off: the options are left out
    args = tracked_training(training, {"engine_uri": uri, "run_id": "abc"}).trainer_args()
    assert args[args.index("--tracking-uri") + 1] == uri and args[args.index("--tracking-run-id") + 1] == "abc"
    assert tracked_training(training, {"engine_uri": "", "run_id": "abc"}) is training
    assert flat({"training": {"epochs": 2}, "data": None}) == {"training.epochs": "2", "data": "None"}


def test_the_summary_shows_each_ranks_wait_and_the_mlflow_run():
    assert data_wait_lines([0.0312, 0.25]) == [
        "- waiting for data (share of each training step, last epoch): rank 0 3.1%, rank 1 25.0%"
    ]
    assert data_wait_lines(None) == [] and tracking_lines(None) == []
    tracked = {"uri": "sqlite:////w/mlflow/mlflow.db", "experiment_id": "1", "run_id": "abc"}
    assert run_page(tracked, "http://127.0.0.1:5000") == "http://127.0.0.1:5000/#/experiments/1/runs/abc"
    assert (
        "([open](http://127.0.0.1:5000/#/experiments/1/runs/abc) with `trainflow mlflow-ui`)"
        in tracking_lines(tracked)[0]
    )


def test_epoch_metrics_name_each_ranks_wait_and_the_highest():
    row = {
        "epoch": 1,
        "train_loss": 0.5,
        "val_top1": 0.9,
        "val_top5": 1.0,
        "images_per_sec": 10.0,
        "data_wait_share": [0.1, 0.3],
    }
    logged = epoch_metrics(row)
    assert logged["data_wait_share"] == 0.3 and logged["data_wait_share/rank1"] == 0.3
    assert logged["val_top1"] == 0.9 and logged["epoch_images_per_sec"] == 10.0


@pytest.mark.timeout(120)
def test_a_tracking_uri_without_mlflow_is_refused_in_one_line(tmp_path):
    hide = (
        "import runpy, sys; sys.modules['mlflow'] = None; sys.argv = sys.argv[1:]; "  # as if not installed
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            hide,
            str(PACKAGE / "train.py"),
            "--data",
            "synthetic",
            "--out",
            str(tmp_path / "out"),
            "--tracking-uri",
            "sqlite:///x.db",
            "--check",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    message = (
        "--tracking-uri sqlite:///x.db needs MLflow in the engine's Python, which lacks it: pip install "
        "mlflow-skinny==3.17.2, or leave --tracking-uri out to train without tracking"
    )
    assert [e for e in map(read_event, done.stdout.splitlines()) if e] == [Failure(message)]  # what the flow reads
    assert f"ERROR error: {message}\n" in done.stdout  # the line for people
    assert not (tmp_path / "out").exists()


def test_tracking_off_makes_no_run_and_tells_the_engine_nothing(tmp_path):
    from flows.config import FlowConfig
    from tasks.track_run import engine_tracking, start_tracking_task

    cfg = FlowConfig.model_validate({"workdir": tmp_path, "data": "synthetic", "tracking": {"enabled": False}})
    assert start_tracking_task.fn(cfg, "r1", tmp_path, "scripts/v", None) is None
    assert engine_tracking(cfg, "abc") is None and tracked_training(cfg.training, None) is cfg.training
    assert not (tmp_path / "mlflow").exists()


@pytest.mark.parametrize("error, status", [(RuntimeError("rank 1 failed"), "FAILED"), (KeyboardInterrupt(), "KILLED")])
def test_a_run_that_fails_or_is_interrupted_does_not_stay_running_in_mlflow(tmp_path, error, status):
    """In a real SQLite store: the MLflow run of a flow that failed (or was interrupted) before finish-tracking ends
    with that status, and the error goes on."""
    tracked = start_run(TrackingConfig(), tmp_path, "r", {"training": {"epochs": 1}}, {})
    with pytest.raises(type(error)), ended_if_unfinished(tracked):
        raise error
    assert client(tracked["uri"]).get_run(tracked["run_id"]).info.status == status
    with ended_if_unfinished(tracked):  # a block that ends well leaves the run alone
        pass
