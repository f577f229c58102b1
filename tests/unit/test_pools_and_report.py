"""Pool slots and leftovers, and the run report's pieces."""

import json
import socket
import subprocess
from pathlib import Path

import pytest

from flows.report import epoch_rows, summary_markdown, svg_plot
from infra.compute import BACKENDS, PoolConfig, PoolError, RunPaths, check_fits
from infra.compute.base import merged_lines
from infra.compute.process import ProcessPool, leftover_runs
from infra.core.errors import BadInput


def test_more_workers_than_slots_is_refused_with_the_fix():
    check_fits(PoolConfig(slots_per_node=2), 2)
    check_fits(PoolConfig(backend="docker", nodes=3, slots_per_node=1), 3)
    with pytest.raises(BadInput, match="training.workers is 3 but the process pool has 2 slots") as failure:
        check_fits(PoolConfig(), 3)
    assert failure.value.exit_code == 2 and "pool.slots_per_node" in str(failure.value)


def run_paths(run_id: str) -> RunPaths:
    return RunPaths(run_id, Path("synthetic"), Path("scripts/v"), Path("out"))


def test_process_pool_lifecycle_and_leftovers(tmp_path):
    crashed = ProcessPool(2, run_paths("crashed-run"), tmp_path)
    crashed.create()
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    crashed.record_process(sleeper.pid)
    gone = subprocess.Popen(["true"])
    gone.wait()  # the crashed run's flow process: no longer running
    marker = json.loads((crashed.folder / "pool.json").read_text())
    (crashed.folder / "pool.json").write_text(json.dumps({**marker, "owner": f"{socket.gethostname()}:{gone.pid}"}))
    pool = ProcessPool(2, run_paths("this-run"), tmp_path)
    pool.create()
    pool.wait_until_ready()
    assert pool.describe()["state"] == "ready" and pool.describe()["slots"] == 2
    assert leftover_runs(tmp_path) == {"crashed-run"}  # a live owner's pool (this run) is kept
    assert pool.delete_leftovers(set()) == ["crashed-run"]
    assert sleeper.wait(timeout=10) != 0 and not crashed.folder.exists()
    pool.delete()
    assert pool.describe()["state"] == "deleted"
    with pytest.raises(PoolError, match="was not created"):
        pool.wait_until_ready()


METRICS = {
    "model": "resnet18",
    "world_size": 2,
    "backend": "ddp",
    "images_per_sec": 123.4,
    "final_val_top1": 0.5,
    "epochs": [
        {"epoch": 1, "train_loss": 2.0, "val_top1": 0.25, "images_per_sec": 100.0, "step": 9},
        {"epoch": 2, "train_loss": 1.0, "val_top1": 0.5, "images_per_sec": 120.0, "step": 18},
    ],
}


def test_report_pieces():
    rows = epoch_rows(METRICS)
    assert rows[1] == {"epoch": 2, "train_loss": 1.0, "val_top1": 0.5, "images_per_sec": 120.0}
    plot = svg_plot(rows)
    assert plot.count("<polyline") == 3 and "val top-1 0.25-0.5" in plot
    summary = {
        "run_id": "r1",
        "dataset": "digits",
        "metrics": METRICS,
        "pool": {"backend": "process"},
        "image": None,
        "results": {"share": "/share/results/r1"},
    }
    text = summary_markdown(summary, {"upload-scripts": 1.5, "run-training": 60.0})
    for needle in (
        "world size: 2 (ddp)",
        "123.4 images/s",
        "val top-1: 50.00%",
        "| run-training | 60.0 |",
        "/share/results/r1",
    ):
        assert needle in text, needle
    assert "scaling efficiency" not in text  # one run has no one-worker baseline: `trainflow bench train` measures it
    assert "| attempt |" not in text  # one-attempt jobs add no table
    attempts = [
        {
            "attempt": 1,
            "job": "trainflow-r1-train-1",
            "ended": "Failed",
            "why": "pre-empted (low-priority nodes taken back)",
            "gpu_hours": 0.9,
            "lost_steps": 20,
        }
    ]
    text = summary_markdown({**summary, "attempts": attempts}, {})
    assert "| 1 | `trainflow-r1-train-1` | Failed | pre-empted (low-priority nodes taken back) | 0.9 | 20 |" in text


@pytest.mark.parametrize("sources", [1, 3])
def test_merged_lines_passes_every_line_in_order_per_source_and_reports_each_end(sources):
    streams = [iter([f"node{n} line{i}\n" for i in range(50)]) for n in range(sources)]
    ended: list[int] = []
    lines = list(merged_lines(streams, ended.append))
    assert sorted(ended) == list(range(sources)) and len(lines) == 50 * sources
    for n in range(sources):
        assert [line for line in lines if line.startswith(f"node{n} ")] == [f"node{n} line{i}\n" for i in range(50)]


def test_every_backend_has_the_interface_and_nothing_else_names_one():
    """Adding a backend is one module and one registry line: every registered backend has the whole interface,
    and no code outside infra/compute compares pool.backend with a backend's name."""
    for name, backend in BACKENDS.items():
        assert backend.name == name
        for attribute in ("needs_image", "settings", "check", "nodes", "scripts_root", "pool", "specs"):
            assert hasattr(backend, attribute), (name, attribute)
    repo = Path(__file__).resolve().parents[2]
    for path in [*repo.glob("flows/**/*.py"), *repo.glob("tasks/*.py"), *repo.glob("infra/*.py")]:
        text = path.read_text()
        for name in BACKENDS:
            for needle in (f'== "{name}"', f'!= "{name}"', "isinstance(pool,"):
                assert needle not in text, (path, needle)
