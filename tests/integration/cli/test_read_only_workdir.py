"""A workdir this user cannot write (a read-only mount: root too is refused there): the commands that only read it
(`runs`, `runs diff`, `predict --model RUN`, `run --dry-run`) work; one that writes is refused in one line. The mount
is made read-only inside a mount namespace of the command alone (`unshare -m`), so nothing of this machine changes."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
TRAINFLOW = str(Path(sys.executable).parent / "trainflow")


def on_read_only(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """`trainflow ARGS --workdir WORKDIR` with WORKDIR mounted read-only."""
    command = shlex.join([TRAINFLOW, *args, "--workdir", str(workdir)])
    mount = f"mount --bind {workdir} {workdir} && mount -o remount,ro,bind {workdir}"
    env = {**os.environ, "PREFECT_API_URL": ""}
    argv = ["unshare", "-m", "sh", "-c", f"{mount} && {command}"]
    return subprocess.run(argv, capture_output=True, text=True, env=env)


def test_the_commands_that_only_read_a_read_only_workdir_work_and_one_that_writes_is_refused(tmp_path):
    workdir = tmp_path / "work"
    (workdir / "runs").mkdir(parents=True)
    listed = on_read_only(workdir, "runs")
    assert listed.returncode == 0, listed.stderr
    planned = on_read_only(workdir, "run", "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert "run-training" in planned.stdout
    missing = on_read_only(workdir, "predict", "--model", "nosuchrun", str(tmp_path))
    assert missing.returncode == 2 and "nosuchrun" in missing.stderr and "cannot write" not in missing.stderr
    refused = on_read_only(workdir, "stage")
    assert refused.returncode != 0
    assert f"workdir {workdir}: cannot write in {workdir} (Read-only file system)" in refused.stderr + refused.stdout
