"""Where the suite's time goes (tests/timeline.py), run for real: a small suite under two workers with --timeline, as
`make test` runs it, then the report of its file. Every test's three phases are written once, by the worker that
ran them; a costly fixture's set-up is written with its scope; the report's tables and plot come from that file."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.paths import REPO

pytestmark = pytest.mark.integration

SUITE = """
import time
import pytest


@pytest.fixture(scope="module")
def costly():
    time.sleep(0.2)  # the fixture's own cost, the thing measured: nothing is awaited


@pytest.mark.parametrize("i", range(4))
def test_with_the_fixture(costly, i):
    pass


@pytest.mark.parametrize("i", range(8))
def test_alone(i):
    pass
"""


def python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'containers'}"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_each_phase_is_written_once_by_its_worker_and_the_report_reads_them(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    timeline = tmp_path / "out" / "timeline.jsonl"
    timeline.parent.mkdir()
    timeline.write_text("a stale line of an earlier run\n")  # emptied by the run
    pytest_args = [
        "-p",
        "tests.timeline",
        "-p",
        "no:cacheprovider",
        "-q",
        "-c",
        os.devnull,
        "--rootdir",
        str(tmp_path),
        str(tmp_path),
    ]
    out = python("-m", "pytest", "-n", "2", "--timeline", str(timeline), *pytest_args, cwd=tmp_path)
    assert out.returncode == 0 and "12 passed" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]

    records = [json.loads(line) for line in timeline.read_text().splitlines()]
    phases = [r for r in records if r["kind"] == "phase"]
    assert len(phases) == 36 and len({(r["test"], r["when"]) for r in phases}) == 36  # 12 tests x 3, each once
    assert {r["worker"] for r in phases} == {"gw0", "gw1"} and {r["outcome"] for r in phases} == {"passed"}
    fixtures = [r for r in records if r["kind"] == "fixture"]
    assert [(r["name"], r["scope"]) for r in fixtures] == [("costly", "module")] * len({r["worker"] for r in fixtures})
    assert {r["worker"] for r in records if r["kind"] == "session"} == {"main", "gw0", "gw1"}

    report = python("-m", "tests.timeline", str(timeline), "--plot", "plot.svg", "--markdown", "page.md", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith("12 tests in ")
    assert "| test_suite.py | 12 |" in report.stdout and "| costly | module | " in report.stdout
    assert (tmp_path / "plot.svg").read_text().lstrip().startswith("<?xml")
    page = (tmp_path / "page.md").read_text()
    assert page.startswith("# Where the suite's time went\n\n![each worker's tests on one time line](plot.svg)\n")
    assert report.stdout in page


def test_a_timeline_cut_mid_line_or_missing_is_refused_in_one_line(tmp_path):
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"kind": "session", "at": 1.0, "event": "start", "worker": "main"}\n{"kind": "pha')
    out = python("-m", "tests.timeline", str(cut), cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.startswith("line 2 of the timeline is not a record"), out.stderr
    out = python("-m", "tests.timeline", str(tmp_path / "none.jsonl"), cwd=tmp_path)
    assert out.returncode == 1 and "is not a file: run the suite with --timeline" in out.stderr
