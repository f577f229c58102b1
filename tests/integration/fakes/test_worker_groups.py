"""The suite's grouping under pytest-xdist (tests/fakes/xdist_groups.py, registered by tests/conftest.py), run for
real: a small suite under two workers with `--dist loadgroup`, as `make test` runs it, with the project's plugin.
Every test that uses the Docker engine runs on one worker, and a module that marks itself `xdist_group` runs its
module fixture once; a test outside the group it needs stops the run before any test."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.paths import REPO

pytestmark = pytest.mark.integration

CONFTEST = """
import os
import pytest
from tests.fakes.xdist_groups import Groups


def pytest_configure(config):
    groups = {"test_a_docker.py": "docker", "test_b_grouped.py": "costly"}
    config.pluginmanager.register(Groups(groups, {"docker_engine": "docker"}))


def record(what):
    with open(os.environ["RECORD"], "a") as out:
        out.write(f"{what} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")


@pytest.fixture(scope="session")
def recorder():
    return record


@pytest.fixture
def docker_engine():
    record("docker")
"""
GROUPED = """
import time
import pytest

pytestmark = pytest.mark.xdist_group("costly")


@pytest.fixture(scope="module")
def costly(recorder):
    recorder("fixture")


@pytest.mark.parametrize("i", range(6))
def test_shares_the_fixture(costly, i):
    time.sleep(0.05)
"""
DOCKER = """
import time
import pytest


@pytest.mark.parametrize("i", range(6))
def test_uses_the_engine(docker_engine, i):
    time.sleep(0.05)
"""
OTHERS = """
import time
import pytest


@pytest.mark.parametrize("i", range(12))
def test_other(i):
    time.sleep(0.05)
"""


def run_suite(folder: Path, modules: dict[str, str], *options: str) -> tuple[subprocess.CompletedProcess, Path]:
    """pytest on `modules` (with the conftest above) in `folder`, as `make test` runs it; and the record file."""
    for name, text in {"conftest.py": CONFTEST, **modules}.items():
        (folder / name).write_text(text)
    record = folder / "record.txt"
    env = {**os.environ, "RECORD": str(record), "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'containers'}"}
    command = [sys.executable, "-m", "pytest", *options, "-p", "no:cacheprovider", "-q", "-c", os.devnull]
    out = subprocess.run(
        [*command, "--rootdir", str(folder), str(folder)],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
        timeout=300,
    )
    return out, record


def test_docker_tests_share_one_worker_and_a_grouped_module_its_fixture(tmp_path):
    modules = {"test_a_docker.py": DOCKER, "test_b_grouped.py": GROUPED, "test_c_others.py": OTHERS}
    out, record = run_suite(tmp_path, modules, "-n", "2", "--dist", "loadgroup")
    assert out.returncode == 0 and "24 passed" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line.split() for line in record.read_text().splitlines()]
    docker_workers = {worker for what, worker in lines if what == "docker"}
    assert sum(what == "docker" for what, _ in lines) == 6 and len(docker_workers) == 1
    assert [what for what, _ in lines].count("fixture") == 1  # once, however the 6 tests were shared out
    assert {worker for _, worker in lines} == {"gw0", "gw1"}  # both workers ran tests: the rest was shared


@pytest.mark.parametrize("workers", [["-n", "0"], ["-n", "2", "--dist", "loadgroup"]], ids=["alone", "workers"])
def test_a_test_outside_the_group_it_needs_stops_the_run_naming_its_module(tmp_path, workers):
    modules = {"test_a_docker.py": DOCKER, "test_d_stray.py": DOCKER.replace("uses_the_engine", "strays")}
    out, record = run_suite(tmp_path, modules, *workers)
    assert out.returncode != 0 and not record.exists(), out.stdout[-3000:]  # no test ran
    assert "test_d_stray.py::test_strays[0] needs group 'docker', but its module test_d_stray.py is in no group" in (
        out.stdout + out.stderr
    )
