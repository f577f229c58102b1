"""Interrupts as people make them, and two commands on one workdir: nothing hangs, nothing is left running,
nothing is left looking alive, and a re-run resumes.

Each test starts `trainflow` in a process group of its own, as a terminal does, and signals the whole group
(Ctrl-C in a terminal is SIGINT to its foreground process group).
"""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from tests.fakes.terminal import Terminal

TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
DEMO = Path(__file__).parents[3] / "flows" / "configs" / "demo.yaml"
# Synthetic data (nothing to stage) and a small model, long enough to be interrupted mid-training.
LONG = (
    "training: {model: resnet18, image_size: 32, batch_size: 8, num_classes: 4, loader_workers: 0, threads: 1,\n"
    "           warmup_epochs: 0, epochs: %d, steps_per_epoch: 20, checkpoint_every: 10, log_every: 5, workers: 2}\n"
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class Command:
    """A trainflow command in its own process group, its output read line by line."""

    def __init__(self, *args: str, **popen):
        self.proc = subprocess.Popen(
            [TRAINFLOW, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            **popen,
        )
        self.lines: list[str] = []

    def wait_for(self, *texts: str, seconds: float = 240) -> None:
        """Read output until each of `texts` has been in a line (in any order)."""
        deadline = time.monotonic() + seconds
        awaited = set(texts)
        for line in self.proc.stdout:
            self.lines.append(line)
            awaited = {text for text in awaited if text not in line}
            if not awaited:
                return
            assert time.monotonic() < deadline, f"no {awaited!r} within {seconds} s:\n{''.join(self.lines[-30:])}"
        pytest.fail(f"ended before {awaited!r}:\n{''.join(self.lines[-30:])}")

    def family(self) -> list[psutil.Process]:
        """Every process it started (services and launchers run in sessions of their own, but are its children)."""
        return psutil.Process(self.proc.pid).children(recursive=True)

    def signal(self, sig: int) -> float:
        """Send `sig` to its whole process group, as a terminal does; the time it was sent."""
        os.killpg(self.proc.pid, sig)
        return time.monotonic()

    def finish(self, seconds: float = 120) -> str:
        """Its exit status once it ends, and the rest of its output."""
        rest, _ = self.proc.communicate(timeout=seconds)
        self.lines.append(rest)
        return "".join(self.lines)


def gone(processes: list[psutil.Process], seconds: float) -> list[str]:
    """The processes still running after `seconds` (their command lines)."""
    _, alive = psutil.wait_procs(processes, timeout=seconds)
    return [" ".join(p.cmdline()) for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def flow_run_states(workdir: Path) -> list[str]:
    """The state of every flow run in the workdir's Prefect database."""
    with sqlite3.connect(workdir / "prefect" / "prefect.db") as db:
        return [row[0] for row in db.execute("select state_type from flow_run")]


def run_records(workdir: Path) -> list[dict]:
    """Every run folder's run.json."""
    return [json.loads(p.read_text()) for p in sorted((workdir / "runs").glob("*/run.json"))]


def start_run(tmp_path: Path, epochs: int) -> tuple[Command, list[str]]:
    """`trainflow run` on synthetic data, training `epochs` epochs of 20 steps; the command and its arguments."""
    (tmp_path / "long.yaml").write_text(LONG % epochs)
    args = ["run", "--config", str(tmp_path / "long.yaml"), "--data", "synthetic", "--workdir", str(tmp_path / "w")]
    return Command(*args), args


def test_one_ctrl_c_stops_everything_marks_the_run_and_says_how_to_resume(tmp_path):
    run, args = start_run(tmp_path, 200)
    run.wait_for("checkpoint step 30 saved")  # past the first epoch: metrics.json says running
    started = run.family()
    assert any("leash.py" in " ".join(p.cmdline()) for p in started)
    sent = run.signal(signal.SIGINT)
    output = run.finish()
    took = time.monotonic() - sent
    print(output[-3000:], f"\nstopped in {took:.1f} s")
    assert run.proc.returncode == 130, output[-3000:]  # stopped, not ended: 200 epochs were left (2.3-2.7 s to stop,
    # measured: docs/benchmarks/earlier-runs.md)
    last = output.strip().splitlines()[-1]
    assert last.startswith("interrupted during run-training: everything it started is stopped"), output[-3000:]
    assert f"run `trainflow {' '.join(args)}` again" in last
    assert "Traceback" not in output and "ConnectError" not in output
    assert gone(started, 2) == []
    assert flow_run_states(tmp_path / "w") == ["CRASHED"]
    [record] = run_records(tmp_path / "w")
    assert record["status"] == "interrupted"
    metrics = json.loads((tmp_path / "w" / "runs" / record["run_id"] / "metrics.json").read_text())
    assert metrics["status"] == "interrupted"


def test_a_second_ctrl_c_exits_at_once_and_still_leaves_nothing_running(tmp_path):
    run, _ = start_run(tmp_path, 200)
    run.wait_for("checkpoint step 10 saved")
    started = run.family()
    run.signal(signal.SIGINT)
    time.sleep(0.3)
    sent = run.signal(signal.SIGINT)
    output = run.finish()
    assert time.monotonic() - sent < 3, output[-2000:]
    assert run.proc.returncode == 130 and "interrupted again: exiting now" in output
    assert gone(started, 12) == []  # each leash stops its group: SIGTERM, then SIGKILL after 5 s


def test_closing_the_terminal_stops_a_run_as_ctrl_c_does_and_spends_no_retry(tmp_path):
    (tmp_path / "long.yaml").write_text(LONG % 200)
    workdir = tmp_path / "w"
    terminal = Terminal(
        [TRAINFLOW, "run", "--config", str(tmp_path / "long.yaml"), "--data", "synthetic", "--workdir", str(workdir)]
    )
    terminal.read_until("checkpoint step 10 saved")
    started = psutil.Process(terminal.proc.pid).children(recursive=True)
    closed = terminal.close()
    assert terminal.proc.wait(timeout=120) == 130  # not 1: no write to the dead terminal failed a step
    print(f"stopped in {time.monotonic() - closed:.1f} s")
    assert gone(started, 2) == []
    assert flow_run_states(workdir) == ["CRASHED"]
    [record] = run_records(workdir)
    assert record["status"] == "interrupted"  # resumable, as after Ctrl-C
    attempts = json.loads((workdir / "runs" / record["run_id"] / "attempts.json").read_text())
    assert len(attempts["attempts"]) == 1, attempts  # the training step was not retried headless


def test_sigterm_to_every_process_at_once_stops_a_run_and_restarts_no_service(tmp_path):
    run, _ = start_run(tmp_path, 200)
    run.wait_for("checkpoint step 10 saved")
    started = run.family()
    for process in [psutil.Process(run.proc.pid), *started]:  # as systemd (KillMode=control-group) and Kubernetes stop
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    output = run.finish()
    assert run.proc.returncode == 130, output[-3000:]
    assert "restart" not in output and "Traceback" not in output, output[-3000:]
    assert gone(started, 2) == []
    assert flow_run_states(tmp_path / "w") == ["CRASHED"]  # Prefect's server outlived the SIGTERM to record it
    [record] = run_records(tmp_path / "w")
    assert record["status"] == "interrupted"


def test_ctrl_c_on_train_names_the_results_folder_to_resume(tmp_path):
    (tmp_path / "long.yaml").write_text(LONG % 200)
    train = Command(
        "train", "--config", str(tmp_path / "long.yaml"), "--data", "synthetic", "--workdir", str(tmp_path / "w")
    )
    train.wait_for("checkpoint step 10 saved")
    started = train.family()
    train.signal(signal.SIGINT)
    output = train.finish()
    assert train.proc.returncode == 130, output[-3000:]
    out = next((tmp_path / "w" / "results").glob("train-*"))
    assert (
        output.strip()
        .splitlines()[-1]
        .startswith(
            f"interrupted: everything it started is stopped; to resume, run `trainflow train --config "
            f"{tmp_path / 'long.yaml'} --data synthetic --workdir {tmp_path / 'w'}` with --out {out}"
        )
    )
    assert gone(started, 2) == []


def test_ctrl_c_while_a_dry_run_hashes_a_big_folder_stops_it_at_once_and_leaves_no_temporary_folder(tmp_path):
    photo = tmp_path / "photo.jpg"
    pixels = np.random.default_rng(0).integers(0, 256, (1000, 1400, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(photo, quality=95)  # about 1 MB of noise: hashed and checked in about 10 ms
    for i in range(3000):  # links: one file's bytes, 3000 paths to hash and check, a minute's work on 2 cores
        folder = tmp_path / "data" / "train" / "ab"[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        os.link(photo, folder / f"{i}.jpg")
    temp = tmp_path / "tmp"
    temp.mkdir()
    run = Command(
        *("run", "--dry-run", "--config", str(DEMO)),  # a config: no photo recipe, so no shrunk copy to plan
        *("--data", str(tmp_path / "data"), "--workdir", str(tmp_path / "w")),
        env={**os.environ, "TMPDIR": str(temp)},
    )
    deadline = time.monotonic() + 120
    while not list(temp.glob(".index-*")):  # the scan's index, where a dry run keeps it
        assert time.monotonic() < deadline and run.proc.poll() is None, run.finish()
        time.sleep(0.05)
    time.sleep(1)
    sent = run.signal(signal.SIGINT)
    output = run.finish(60)
    took = time.monotonic() - sent
    assert run.proc.returncode == 130 and "Traceback" not in output, output[-3000:]
    assert took < 5, f"took {took:.1f} s to stop"  # the hashes queued are dropped, not finished
    assert list(temp.iterdir()) == []


def test_a_second_command_on_a_busy_workdir_is_refused_naming_the_first(tmp_path, digits):
    workdir = tmp_path / "w"
    first = Command("stage", "--data", str(digits), "--workdir", str(workdir))
    deadline = time.monotonic() + 60
    while not (workdir / "trainflow.lock").exists() or not (workdir / "trainflow.lock").read_text():
        assert time.monotonic() < deadline and first.proc.poll() is None
        time.sleep(0.1)
    second = subprocess.run(
        [TRAINFLOW, "stage", "--data", str(digits), "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 2
    assert (
        f"is in use by `trainflow stage --data {digits} --workdir {workdir}` (pid {first.proc.pid}" in second.stderr
    ), second.stderr
    output = first.finish(300)
    assert first.proc.returncode == 0, output[-3000:]
    assert "staged" in output or "file server copy" in output
