"""Experiment tracking, live progress and the data-wait share, end to end with real services only: `trainflow run`
(the CLI) trains the digits set on the process pool against the Prefect server of `trainflow ui`; meanwhile the
test watches the training step's progress artifact move in Prefect's API; then it reads the run's MLflow run back
from the workdir's SQLite store with MLflow's client, opens the flow run's page in headless Chromium to see the
progress artifact, and asks `trainflow mlflow-ui` for the run."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from infra.services.prefect_server import api_answers
from infra.services.supervise import free_port, running_service
from tests.fakes.browser import CHROMIUM, CHROMIUM_ARGS, ApiWatch
from tests.fakes.flow_runs import SMALL
from tests.fakes.paths import BIN
from tests.fakes.prefect import prefect_env

pytestmark = [pytest.mark.integration]
TRAINING = {**SMALL, "workers": 2, "epochs": 2, "log_every": 2}


def artifacts(api: str, **where) -> list[dict]:
    """Artifacts the Prefect API holds, filtered as `where` says (e.g. type, flow_run_id)."""
    body = {"artifacts": {k: {"any_": v} for k, v in where.items()}}
    return requests.post(f"{api}/artifacts/filter", json=body, timeout=10).json()


def run_watching_progress(command: list[str], env: dict, api: str, log: Path) -> set[float]:
    """Run `command` to its end, reading the progress artifacts every half second; the values seen."""
    seen: set[float] = set()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            seen |= {a["data"] for a in artifacts(api, type=["progress"])}
            time.sleep(0.5)
    assert proc.returncode == 0, log.read_text()[-3000:]
    return seen


def mlflow_run(workdir: Path, run_id: str):
    """The MLflow run of pipeline run `run_id`, from the workdir's SQLite store, and a client on that store."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainflow").experiment_id
    [found] = client.search_runs([experiment], filter_string=f"tags.`trainflow.run_id` = '{run_id}'")
    return client, found


def check_the_mlflow_run(workdir: Path, run_id: str, metrics: dict) -> str:
    """Params, tags, per-step and per-epoch metrics, the model and the plot; the MLflow run's id."""
    client, run = mlflow_run(workdir, run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == run_id
    assert run.data.params["training.epochs"] == "2" and run.data.params["training.model"] == "resnet18"
    assert run.data.tags["data_version"].startswith(str(workdir / "fileserver"))
    assert run.data.tags["scripts_version"] and run.data.tags["image"] == "none (process pool)"
    history = {
        key: client.get_metric_history(run.info.run_id, key)
        for key in ("loss", "lr", "images_per_sec", "val_top1", "val_top5", "data_wait_share/rank1", "final_val_top1")
    }
    steps = metrics["global_step"]
    assert [m.step for m in history["loss"]] == list(range(2, steps + 1, 2))  # every log_every steps, from the engine
    assert len(history["lr"]) == len(history["images_per_sec"]) == len(history["loss"])
    assert [m.value for m in history["val_top1"]] == [e["val_top1"] for e in metrics["epochs"]]  # one per epoch
    assert [m.value for m in history["data_wait_share/rank1"]] == [e["data_wait_share"][1] for e in metrics["epochs"]]
    assert history["final_val_top1"][0].value == metrics["final_val_top1"]
    files = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"model.pt", "plot.svg"} <= files
    plot = Path(client.download_artifacts(run.info.run_id, "plot.svg", str(workdir.parent / "plot")))
    assert plot.read_text().count('id="axes_') == 3  # the run's chart, its 3 panels
    return run.info.run_id


def check_the_progress_page(api: str, port: int, flow_run_id: str, profile: Path) -> None:
    """The flow run's page in headless Chromium shows the training step's progress artifact, every API call answered."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page()
        watch = ApiWatch(page, port)
        page.goto(f"http://127.0.0.1:{port}/v2/runs/flow-run/{flow_run_id}")
        page.get_by_role("tab", name="Artifacts").click()
        expect(page.get_by_text("training-progress").first).to_be_visible(timeout=30_000)
        watch.settle()
        browser.close()
    assert not watch.problems, "\n".join(watch.problems)


def check_the_mlflow_ui(workdir: Path, mlflow_run_id: str, tmp_path: Path) -> None:
    """`trainflow mlflow-ui` serves the workdir's store: the run, its metrics and its artifacts."""
    port = free_port()
    ui = f"http://127.0.0.1:{port}"
    command = [str(BIN / "trainflow"), "mlflow-ui", "--workdir", str(workdir), "--port", str(port)]
    with running_service(command, tmp_path / "mlflow-ui.log", lambda: ui_answers(ui), "trainflow mlflow-ui", 180):
        run = requests.get(f"{ui}/api/2.0/mlflow/runs/get", params={"run_id": mlflow_run_id}, timeout=30).json()
        listed = requests.get(f"{ui}/api/2.0/mlflow/artifacts/list", params={"run_id": mlflow_run_id}, timeout=30)
    assert {m["key"] for m in run["run"]["data"]["metrics"]} >= {"loss", "val_top1", "data_wait_share"}
    assert {f["path"] for f in listed.json()["files"]} >= {"model.pt", "plot.svg"}


def ui_answers(ui: str) -> bool:
    try:
        return requests.get(f"{ui}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_run_is_tracked_in_mlflow_shows_live_progress_and_where_the_time_went(digits, tmp_path):
    port = free_port()
    api, workdir = f"http://127.0.0.1:{port}/api", tmp_path / "work"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"training": TRAINING}))
    ui = [str(BIN / "trainflow"), "ui", "--workdir", str(tmp_path / "ui"), "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_API_URL", "PREFECT_HOME")}
    with running_service(ui, tmp_path / "ui.log", lambda: api_answers(api), "trainflow ui", 120, env=env):
        seen = run_watching_progress(
            [
                str(BIN / "trainflow"),
                "run",
                "--config",
                str(tmp_path / "run.yaml"),
                "--data",
                str(digits),
                "--workdir",
                str(workdir),
            ],
            prefect_env(api, tmp_path / "client"),
            api,
            tmp_path / "run.log",
        )
        [progress] = artifacts(api, type=["progress"])
        assert progress["key"] == "training-progress" and progress["data"] == 100.0
        assert any(0 < value < 100 for value in seen), seen  # it moved while the job ran
        flow_run_id = progress["flow_run_id"]
        [summary] = [a for a in artifacts(api, flow_run_id=[flow_run_id]) if a["key"] == "run-summary"]
        run_id = summary["data"].split("`")[1]  # "# Training run `<run id>`"
        metrics = json.loads((workdir / "runs" / run_id / "metrics.json").read_text())
        shares = metrics["data_wait_share"]
        assert (
            len(shares) == 2 and all(0 <= s <= 1 for s in shares) and shares == metrics["epochs"][-1]["data_wait_share"]
        )
        assert f"rank 0 {shares[0]:.1%}, rank 1 {shares[1]:.1%}" in summary["data"]
        mlflow_run_id = check_the_mlflow_run(workdir, run_id, metrics)
        assert f"MLflow run: `{mlflow_run_id}`" in summary["data"]
        check_the_progress_page(api, port, flow_run_id, tmp_path / "chromium")
    check_the_mlflow_ui(workdir, mlflow_run_id, tmp_path)


@pytest.mark.timeout(600)
def test_the_engine_alone_logs_into_a_run_of_its_own_and_tensorboard_event_files(tmp_path):
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from infra.engines.contract import PACKAGE

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run(
        [
            sys.executable,
            str(PACKAGE / "train.py"),
            "--data",
            "synthetic",
            "--out",
            str(tmp_path / "out"),
            "--model",
            "resnet18",
            "--epochs",
            "1",
            "--steps-per-epoch",
            "2",
            "--batch-size",
            "4",
            "--image-size",
            "32",
            "--num-classes",
            "4",
            "--log-every",
            "1",
            "--threads",
            "1",
            "--tracking-uri",
            uri,
            "--tensorboard",
            str(tmp_path / "tb"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("trainflow").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["model"] == "resnet18"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]
    assert len(client.get_metric_history(run.info.run_id, "data_wait_share/rank0")) == 1
    events = EventAccumulator(str(tmp_path / "tb" / "out")).Reload()  # a subfolder named after --out
    assert [e.step for e in events.Scalars("loss")] == [1, 2] and len(events.Scalars("data_wait_share/rank0")) == 1
