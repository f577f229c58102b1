"""`trainflow bench staging` at its smallest: three rounds of three paths through a real Azurite, the JSON."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient

from benchmarks.staging import PATHS, per_file
from infra.data.sample_data import write_imagenet_like
from infra.services.azurite import connection_string, running_azurite

pytestmark = [pytest.mark.integration, pytest.mark.long]  # the benchmark commands' own runs
TRAINFLOW = str(Path(sys.executable).with_name("trainflow"))
FIGURE = {"median", "min", "max", "all"}


def test_bench_staging_repeats_every_path_and_writes_the_json(tmp_path):
    out = subprocess.run(
        [
            TRAINFLOW,
            "bench",
            "staging",
            "--files",
            "40",
            "--classes",
            "4",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(tmp_path / "staging.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "staging.json").read_text())
    assert result["files"] == 40 and result["repeats"] == 3 and list(result["paths"]) == list(PATHS)
    for figures in result["paths"].values():
        assert all(
            set(f) == FIGURE and len(f["all"]) == 3 and f["min"] <= f["median"] <= f["max"] for f in figures.values()
        )
    for ratio in ("speedup_vs_one_at_a_time", "speedup_vs_thread_pool", "rerun_fraction"):
        assert set(result[ratio]) == FIGURE and result[ratio]["median"] > 0
    assert result["rerun_fraction"]["median"] < 1  # nothing to send the second time
    shrunk = result["shrunk"]  # photo-sized JPEGs: most are over 500 px, so the staged bytes fall
    assert shrunk["max_side"] == 500 and shrunk["files_shrunk"] > 0 and shrunk["bytes_fraction"] < 1
    assert result["machine"]["cores"] >= 1 and result["machine"]["versions"]["torch"]
    printed = " ".join(out.stdout.split())  # the console wraps at its width
    assert "per file, thread pool" in printed and "over per-file with 8 threads" in printed


@pytest.mark.parametrize("workers", [1, 8])
def test_the_per_file_baselines_move_every_file(tmp_path, workers):
    data = write_imagenet_like(tmp_path / "data", files=12, classes=3)
    with running_azurite(tmp_path / "azurite") as port:
        per_file(
            BlobServiceClient.from_connection_string(connection_string(port)),
            "naive",
            data,
            tmp_path / "export",
            workers,
        )
    sent = {p.relative_to(data): p.read_bytes() for p in data.rglob("*") if p.is_file()}
    assert {
        p.relative_to(tmp_path / "export"): p.read_bytes() for p in (tmp_path / "export").rglob("*") if p.is_file()
    } == sent and len(sent) == 12


def test_bench_all_writes_the_report_and_a_plot_per_benchmark(tmp_path):
    """`bench all --size tiny` with the two benchmarks that train nothing: one JSON, the report and its plots."""
    out = subprocess.run(
        [
            TRAINFLOW,
            "bench",
            "all",
            "--size",
            "tiny",
            "--only",
            "scale",
            "--only",
            "staging",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(tmp_path / "all.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "all.json").read_text())
    assert list(result["benches"]) == ["staging", "scale"] and result["size"] == "tiny"  # in bench all's order
    assert result["benches"]["staging"]["files"] == 40 and result["benches"]["scale"]["points"][0]["files"] == 300
    report = (tmp_path / "all.md").read_text()
    for name in ("staging", "scale"):
        assert f"![{name}](all-{name}.svg)" in report
        assert ET.parse(tmp_path / f"all-{name}.svg").getroot().tag.endswith("svg")
    assert "trainflow bench all --json all.json --only scale --only staging --size tiny" in report
    assert f"Machine: {result['machine']['cores']} cores" in report
