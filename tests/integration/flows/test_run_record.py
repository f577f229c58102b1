"""The record of a run after any ending: a `trainflow run` killed outright (SIGKILL to its process group, as kill -9
or the OOM killer) takes its services along, is resumed, interrupted with Ctrl-C, and resumed again to the end; the
run counts every attempt's time in its ledger, receipt, `trainflow runs` and MLflow run; and the copy of its
results on the file share holds every file the run folder does.

The test times each attempt at training itself, from the output the user sees: from the line that says the pool
is ready (create-pool finished; run-training starts next) to the kill, the Ctrl-C, or the line that says
run-training finished.
"""

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.flows.test_interrupts import LONG, TRAINFLOW, Command, gone, run_records

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

POOL_READY = re.compile(r"Task run 'create-pool-\w+' - Finished in state Completed")
TRAINED = re.compile(r"Task run 'run-training-\w+' - Finished in state Completed")


def arrives(command: Command, pattern: re.Pattern | str, seconds: float = 300) -> float:
    """Read the command's output until a line matches `pattern`; when that line arrived."""
    deadline = time.monotonic() + seconds
    assert command.proc.stdout is not None
    for line in command.proc.stdout:
        command.lines.append(line)
        if re.search(pattern, line):
            return time.monotonic()
        assert time.monotonic() < deadline, f"no {pattern!r} within {seconds} s:\n{''.join(command.lines[-30:])}"
    pytest.fail(f"ended before {pattern!r}:\n{''.join(command.lines[-30:])}")


def stopped_at(command: Command, after: str, sig: int) -> tuple[float, list[psutil.Process]]:
    """Run until the pool is ready and `after` is printed, then send `sig` to the command's process group: the
    seconds the attempt at training had run when it was sent, and every process the command had started."""
    started = arrives(command, POOL_READY)
    arrives(command, re.escape(after))
    family = command.family()
    return command.signal(sig) - started, family


def test_every_attempt_of_a_killed_interrupted_and_resumed_run_is_counted(tmp_path):
    (tmp_path / "long.yaml").write_text(LONG % 3)  # 60 steps, a checkpoint every 10
    workdir = tmp_path / "w"
    args = ["run", "--config", str(tmp_path / "long.yaml"), "--data", "synthetic", "--workdir", str(workdir)]

    killed = Command(*args)
    wall, family = stopped_at(killed, "checkpoint step 20 saved", signal.SIGKILL)
    walls = [wall]
    killed.finish()
    assert gone(family, 12) == []  # Azurite, Prefect's server, torchrun and its workers went with it
    [record] = run_records(workdir)
    assert record["status"] == "running"  # as the killed run left it
    interrupted = Command(*args)
    walls.append(stopped_at(interrupted, "checkpoint step 40 saved", signal.SIGINT)[0])
    output = interrupted.finish()
    assert f"resuming run {record['run_id']}" in output and "resumed from step-" in output, output[-3000:]
    assert interrupted.proc.returncode == 130, output[-3000:]
    last = Command(*args)
    started = arrives(last, POOL_READY)
    walls.append(arrives(last, TRAINED) - started)
    output = last.finish(300)
    assert last.proc.returncode == 0 and "resuming run" in output, output[-3000:]

    [folder] = (workdir / "runs").iterdir()  # one run: each re-run resumed it
    check_the_run_resumed_its_checkpoints(folder, record)
    ledger = json.loads((folder / "ledger.json").read_text())
    training = {row["step"]: row for row in ledger["steps"]}["run-training"]
    print(f"attempts measured {[round(w, 1) for w in walls]} s, counted {[a['seconds'] for a in ledger['attempts']]}")
    assert [a["ended"] for a in ledger["attempts"]] == ["killed", "interrupted", "completed"]
    assert training["seconds"] == pytest.approx(sum(walls), rel=0.10)  # the goal: within 10 %
    for measured, counted in zip(walls, ledger["attempts"]):
        assert counted["seconds"] == pytest.approx(measured, abs=3), (walls, ledger["attempts"])
    check_the_sum_is_shown_everywhere(workdir, folder, ledger)
    check_the_share_holds_the_run_folder(workdir, folder)


def check_the_run_resumed_its_checkpoints(folder: Path, record: dict) -> None:
    """Each re-run resumed from the checkpoint the attempt before it left, and the receipt is keyed by the inputs the
    first attempt recorded."""
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["status"] == "complete" and len(metrics["resumed_from_steps"]) == 2, metrics["resumed_from_steps"]
    assert metrics["resumed_from_steps"][0] >= 20 and metrics["resumed_from_steps"][1] >= 40
    receipt = json.loads((folder / "receipt.json").read_text())
    assert receipt["inputs"] == record["fingerprint"] and receipt["run_id"] == record["run_id"]
    assert receipt["parameter_digest"] == metrics["parameter_digest"] and receipt["data_manifest"] is None  # synthetic


def check_the_sum_is_shown_everywhere(workdir: Path, folder: Path, ledger: dict) -> None:
    """The receipt, `trainflow runs` (JSON and table) and the MLflow run show the ledger's sum of the attempts."""
    training = {row["step"]: row for row in ledger["steps"]}["run-training"]["seconds"]
    node_hours = round(ledger["total"]["node_seconds"] / 3600, 4)
    cost = json.loads((folder / "receipt.json").read_text())["cost"]
    assert (cost["training_seconds"], cost["node_hours"]) == (training, node_hours)
    assert [a["ended"] for a in cost["attempts"]] == ["killed", "interrupted", "completed"]
    runs = subprocess.run([TRAINFLOW, "runs", "--workdir", str(workdir), "--json"], capture_output=True, text=True)
    [row] = json.loads(runs.stdout)
    assert (row["training_seconds"], row["node_hours"], len(row["attempts"])) == (training, node_hours, 3)
    table = subprocess.run([TRAINFLOW, "runs", "--workdir", str(workdir)], capture_output=True, text=True)
    assert "3: 1 killed, 1 interrupted" in table.stdout and f"{training:.0f}" in table.stdout, table.stdout
    from mlflow import MlflowClient

    mlflow = MlflowClient(f"sqlite:///{workdir / 'mlflow' / 'mlflow.db'}")
    [finished] = mlflow.search_runs(
        [mlflow.get_experiment_by_name("trainflow").experiment_id],
        f"tags.`trainflow.run_id` = '{folder.name}' and attributes.status = 'FINISHED'",
    )
    assert finished.data.metrics["training_seconds"] == pytest.approx(training)
    assert finished.data.metrics["node_hours"] == pytest.approx(node_hours) and finished.data.metrics["attempts"] == 3
    earlier = mlflow.search_runs(
        [finished.info.experiment_id], f"tags.`trainflow.run_id` = '{folder.name}' and attributes.status != 'FINISHED'"
    )
    assert sorted(run.info.status for run in earlier) == ["KILLED", "KILLED"]  # the SIGKILLed one too, not RUNNING
    logged = {f.path for f in mlflow.list_artifacts(finished.info.run_id)}
    assert {"ledger.json", "receipt.json", "plot.svg", "README.md"} <= logged


def check_the_share_holds_the_run_folder(workdir: Path, folder: Path) -> None:
    """The file share's copy of the results holds every file of the run folder, its record saying complete, and
    the folder's README names the model, the metrics, the plot, the logs, the ledger and the receipt."""
    shared = workdir / "fileshare" / "results" / folder.name
    files = lambda root: sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())  # noqa: E731 - a one-line helper, read where it is used
    assert files(shared) == files(folder)
    assert {"plot.svg", "ledger.json", "README.md", "attempts.json"} <= set(files(shared))
    assert json.loads((shared / "run.json").read_text())["status"] == "complete"
    guide = (shared / "README.md").read_text()
    for name in ("model.pt", "metrics.json", "plot.svg", "logs", "ledger.json", "receipt.json"):
        assert f"- `{name}`: " in guide, name
