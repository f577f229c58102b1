"""`trainflow bench scale` at its smallest: every stage measured in a process of its own, the table and the JSON."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long]  # the benchmark command's own runs
TRAINFLOW = str(Path(sys.executable).with_name("trainflow"))
STAGES = ["first", "unchanged", "one changed", "1% changed", "training start-up"]


def test_bench_scale_measures_every_stage_and_writes_the_json(tmp_path):
    out = subprocess.run(
        [
            TRAINFLOW,
            "bench",
            "scale",
            "--files",
            "300",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(tmp_path / "scale.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    [point] = json.loads((tmp_path / "scale.json").read_text())["points"]
    assert point["files"] == 300 and list(point["stages"]) == STAGES
    first, unchanged = point["stages"]["first"], point["stages"]["unchanged"]
    assert first["uploaded files"] == first["fetched files"] == 300
    assert set(first["phases"]) == {
        "upload: list + hash + check",
        "upload: pack + upload",
        "upload: manifest",
        "sync: manifest",
        "sync: link + fetch + extract",
    }
    assert unchanged["uploaded files"] == unchanged["fetched files"] == 0
    assert point["stages"]["one changed"]["files changed"] == 1 and point["stages"]["1% changed"]["files changed"] == 3
    assert (
        point["stages"]["one changed"]["uploaded files"] >= 1 and point["stages"]["one changed"]["fetched files"] == 1
    )
    for stage in STAGES:
        assert point["stages"][stage]["seconds"] > 0 and point["stages"][stage]["peak_rss_mb"] > 0
    assert "µs/file" in out.stdout and "training start-up" in out.stdout


def test_a_stage_reports_its_own_peak_memory_not_that_of_the_process_that_started_it():
    """Linux carries a parent's peak RSS into a child's ru_maxrss across exec; the stage's figure is its own."""
    held = bytearray(600 << 20)  # the bench process holding much (a million paths), pages touched
    held[::4096] = b"x" * len(held[::4096])
    code = (
        "import resource; from trainer.memory import peak_resident_mb; "
        "print(peak_resident_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    own, inherited = map(
        float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    del held
    assert inherited > 600 and own < 400, (own, inherited)
