"""Two things trainflow lets a user do, each with one line on stderr that is not an error: take over a workdir whose
lock a killed command left, and run more local workers than the machine has cores."""

import json
import os
import signal
import subprocess
import sys

from nodelib.cores import usable_cores
from tests.fakes.paths import BIN

HOLD = (
    "import sys, time; from pathlib import Path; from infra.runs.workdir import workdir_lock\n"
    "with workdir_lock(Path(sys.argv[1])):\n"
    "    print('held', flush=True); time.sleep(60)"
)
TAKE = (
    "import sys; from pathlib import Path; from infra.runs.workdir import workdir_lock\n"
    "with workdir_lock(Path(sys.argv[1])): print('got it')"
)


def take(workdir) -> subprocess.CompletedProcess:
    """Take the workdir's lock in a process of its own, as a command does, and let it go."""
    return subprocess.run([sys.executable, "-c", TAKE, str(workdir)], capture_output=True, text=True, timeout=60)


def test_a_lock_left_by_a_killed_command_is_reclaimed_with_a_line_naming_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    left = json.loads((tmp_path / "trainflow.lock").read_text())
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    reclaimed = take(tmp_path)
    assert reclaimed.returncode == 0 and reclaimed.stdout == "got it\n"
    assert reclaimed.stderr == (
        f"workdir {tmp_path} was left locked by `{left['command']}` (pid {holder.pid} on {left['host']}, since "
        f"{left['since']}), which is no longer running (killed?); reclaimed\n"
    )
    again = take(tmp_path)  # released as a command releases it: nothing to say
    assert (again.returncode, again.stdout, again.stderr) == (0, "got it\n", "")


def dry_run(tmp_path, workers: int) -> subprocess.CompletedProcess:
    """`trainflow run --dry-run` with `workers` local workers and as many slots."""
    config = tmp_path / "c.yaml"
    config.write_text(f"training: {{workers: {workers}}}\npool: {{slots_per_node: {workers}}}\n")
    return subprocess.run(
        [BIN / "trainflow", "run", "--dry-run", "--config", config, "--workdir", tmp_path / "w"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "400"},
    )


def test_more_local_workers_than_cores_warn_once_and_run(tmp_path):
    cores = usable_cores()
    over = dry_run(tmp_path, cores + 1)
    assert over.returncode == 0, over.stderr
    assert over.stderr.splitlines() == [
        f"warning: {cores + 1} workers on {cores} cores oversubscribe this machine (each worker gets part of a core, "
        f"so the run is no faster than with {cores}); set training.workers (--workers) to {cores} or fewer unless "
        "that is what you test"
    ]
    assert "run-training" in over.stdout
    assert dry_run(tmp_path, cores).stderr == ""


def test_train_warns_once_before_its_checks(tmp_path):
    cores = usable_cores()
    (tmp_path / "file").write_text("")
    args = ["train", "--data", "synthetic", "--model", "resnet18", "--workers", str(cores + 1), "--workdir", tmp_path]
    done = subprocess.run(
        [BIN / "trainflow", *args, "--out", tmp_path / "file" / "out"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert done.returncode == 2
    warning, refused = done.stderr.splitlines()  # the warning once, then the check that refuses the results folder
    assert warning.startswith(f"warning: {cores + 1} workers on {cores} cores oversubscribe this machine")
    assert refused.startswith(f"error: output folder {tmp_path / 'file' / 'out'} is not writable")
