"""A CPU quota on the trainer's control group (what `docker run --cpus` and a Kubernetes CPU limit set) is the number
of cores it counts: a real cgroup with a quota, made here, holds the trainer while it trains."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.data.sample_data import write_digits
from infra.engines.contract import PACKAGE
from nodelib.cores import cpu_folders

pytestmark = pytest.mark.integration


@pytest.fixture
def one_core_group() -> Iterator[Path]:
    """A new cgroup v1 cpu group below this process's own, limited to one core (50 ms of every 50 ms)."""
    groups, mounts = Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
    v1 = [folder for folder, _, version in cpu_folders(groups, mounts) if version == "v1"]
    if os.geteuid() != 0 or not v1 or not os.access(v1[0], os.W_OK):
        pytest.skip(
            "making a cgroup with a CPU quota needs root and cgroup v1's cpu controller (CI's machine has both)"
        )
    group = v1[0] / f"trainflow-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("50000")
        (group / "cpu.cfs_quota_us").write_text("50000")
        yield group
    finally:
        group.rmdir()  # empty again: the processes run in it have exited


def run_in(group: Path, *argv: str) -> subprocess.CompletedProcess:
    """argv, run inside `group` (the shell moves itself there, then becomes argv)."""
    script = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
    return subprocess.run(["sh", "-c", script, "sh", *argv], capture_output=True, text=True, timeout=300)


def test_a_process_in_a_one_core_group_counts_one_core(one_core_group):
    code = "from nodelib.cores import cpu_quota, usable_cores; print(cpu_quota(), usable_cores())"
    done = run_in(one_core_group, sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1.0", "1"]


def test_the_trainer_in_a_one_core_group_picks_its_loader_workers_for_one_core(one_core_group, tmp_path):
    assert len(os.sched_getaffinity(0)) >= 2, "the test tells one core from the machine's: it needs two"
    data = write_digits(tmp_path / "digits", fmt="jpg")
    argv = ["--data", str(data), "--out", str(tmp_path / "out"), "--model", "resnet18", "--image-size", "16"]
    argv += ["--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "2", "--log-every", "1"]
    done = run_in(one_core_group, sys.executable, str(PACKAGE / "train.py"), *argv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loader workers: 1 (--loader-workers auto: 1 cores a training process; " in done.stdout + done.stderr
