"""A resumed run in MLflow, in a real SQLite store: the run of an attempt killed outright ends KILLED when the run is
resumed, and the run that finishes holds the cost over every attempt (the ledger's summary) and the ledger."""

from flows.config import FlowConfig
from infra.core.jsonfiles import write_json
from infra.runs.ledger import LEDGER, make_ledger
from infra.runs.tracking import client, end_unfinished
from tasks.track_run import finish_tracking_task, start_tracking_task
from tests.fakes.ledgers import CPU_NODE, attempt


def test_a_resumed_run_ends_its_killed_attempts_mlflow_run_and_its_last_run_holds_the_sum(tmp_path):
    cfg = FlowConfig.model_validate({"workdir": tmp_path, "data": "synthetic"})
    start = lambda run_id: start_tracking_task.fn(cfg, run_id, tmp_path, "scripts/v", None)  # noqa: E731 - a one-line helper, read where it is used
    killed = start("run-1")  # its process is then killed outright: nothing ends its MLflow run
    failed = start("run-1")
    end_unfinished(failed, "FAILED")
    other = start("run-2")
    last = start("run-1")  # the re-run that resumes run-1
    mlflow = client(last["uri"])
    status = lambda tracked: mlflow.get_run(tracked["run_id"]).info.status  # noqa: E731 - a one-line helper, read where it is used
    assert [status(t) for t in (killed, failed, other, last)] == ["KILLED", "FAILED", "RUNNING", "RUNNING"]

    out = tmp_path / "runs" / "run-1"
    tries = [attempt(1, "killed", 1800.0), attempt(2, "completed", 5400.0)]
    write_json(out / LEDGER, make_ledger(CPU_NODE, {"run-training": 0.0}, [], tries))
    (out / "model.pt").write_bytes(b"weights")
    finish_tracking_task.fn(last, {"global_step": 10}, out, "model.pt")
    run = mlflow.get_run(last["run_id"])
    assert run.info.status == "FINISHED"
    assert {k: run.data.metrics[k] for k in ("training_seconds", "attempts", "node_hours", "cost")} == {
        "training_seconds": 7200.0,
        "attempts": 2.0,
        "node_hours": 2.0,
        "cost": 1.5,
    }
    assert {f.path for f in mlflow.list_artifacts(last["run_id"])} == {"model.pt", LEDGER}
