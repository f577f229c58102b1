"""The suite's grouping under pytest-xdist (tests/conftest.py), run for real: a small suite under two workers with
`--dist loadgroup`, as `make test` runs, with the project's collection hook. Every test that uses the Docker engine
runs on one worker, and a module that marks itself `xdist_group` runs its module fixture once."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import os
import pytest
from tests.conftest import pytest_collection_modifyitems  # noqa: F401 - the hook under test


def record(what):
    with open(os.environ["RECORD"], "a") as out:
        out.write(f"{what} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.fixture
def docker_engine():
    record("docker")
"""
GROUPED = """
import time
import pytest
from conftest import record

pytestmark = pytest.mark.xdist_group("costly")


@pytest.fixture(scope="module")
def costly():
    record("fixture")


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


def test_docker_tests_share_one_worker_and_a_grouped_module_its_fixture(tmp_path):
    for name, text in {
        "conftest.py": CONFTEST,
        "test_a_docker.py": DOCKER,
        "test_b_grouped.py": GROUPED,
        "test_c_others.py": OTHERS,
    }.items():
        (tmp_path / name).write_text(text)
    record = tmp_path / "record.txt"
    env = {**os.environ, "RECORD": str(record), "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'containers'}"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
            "-q",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0 and "24 passed" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line.split() for line in record.read_text().splitlines()]
    docker_workers = {worker for what, worker in lines if what == "docker"}
    assert sum(what == "docker" for what, _ in lines) == 6 and len(docker_workers) == 1
    assert [what for what, _ in lines].count("fixture") == 1  # once, however the 6 tests were shared out
