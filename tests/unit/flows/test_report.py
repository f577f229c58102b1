"""The run report's pieces: the epochs' rows, the plot, the summary with its attempts and the images left out."""

import re
from pathlib import Path

from flows.report import epoch_rows, step_rows, summary_markdown, svg_plot
from infra.engines.contract import Metrics
from trainer import data

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
    texts = re.findall(r"<text[^>]*>([^<]*)", plot)  # letters kept as text: what a reader sees
    assert plot.count('id="axes_') == 3 and texts.count("epoch") == 3  # a panel per quantity, each against the epoch
    for label in ("training loss (cross-entropy)", "validation accuracy (%)", "training throughput (images/s)"):
        assert label in texts  # each axis says its unit
    assert {"train", "top-1", "all workers"} <= set(texts) and "top-5" not in texts  # legends of what was measured
    assert svg_plot([]).count("no epoch recorded") == 3
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
        "| run-training | ran |  |  |  | 60.0 |",
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


def test_the_run_summary_shows_the_images_left_out():
    entry = data.bad_files_entry([(f"train/a/{i}.png", "truncated") for i in range(30)], Path("/results/bad-files.tsv"))
    assert entry["count"] == 30 and len(entry["first"]) == 20
    metrics = Metrics(
        status="complete",
        model="resnet18",
        world_size=2,
        backend="ddp",
        images_per_sec=10.0,
        wall_seconds=3.0,
        bad_files=entry,
    ).to_json()
    summary = {
        "run_id": "r1",
        "dataset": "d",
        "metrics": metrics,
        "pool": {"backend": "process"},
        "image": None,
        "results": {"share": "/share/results/r1"},
    }
    assert "- images left out (cannot be decoded): 30, listed in `/share/results/r1/bad-files.tsv`" in summary_markdown(
        summary, {}
    )
    assert "left out" not in summary_markdown({**summary, "metrics": {**metrics, "bad_files": None}}, {})


def test_each_step_says_what_it_did_why_what_it_moved_and_how_long_it_took():
    done = [
        {"step": "build-image", "did": "skipped", "why": "nothing runs in an image on the process pool"},
        {"step": "upload-dataset", "did": "skipped", "why": "digits unchanged", "files": 0, "MB": 0.0, "seconds": 0.4},
        {"step": "run-training", "did": "ran", "why": "resnet18 on 2 workers (torchrun)"},
    ]
    rows = step_rows(done, {"upload-dataset": 3.0, "run-training": 61.25, "delete-pool": 0.5})
    assert rows == [
        {
            "step": "build-image",
            "did": "skipped",
            "why": "nothing runs in an image on the process pool",
            "files": "",
            "MB": "",
            "seconds": "0.0",
        },
        {
            "step": "upload-dataset",
            "did": "skipped",
            "why": "digits unchanged",
            "files": "0",
            "MB": "0.0",
            "seconds": "3.0",
        },  # its task's seconds (the scan and the upload), not only the transfer's
        {
            "step": "run-training",
            "did": "ran",
            "why": "resnet18 on 2 workers (torchrun)",
            "files": "",
            "MB": "",
            "seconds": "61.2",
        },
        {"step": "delete-pool", "did": "ran", "why": "", "files": "", "MB": "", "seconds": "0.5"},
    ]
