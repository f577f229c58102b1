"""Receipts, the list of past runs and what differed between two: over run folders written as the flow writes them."""

import json
import os

import pytest

from flows.config import load_config
from infra.core.errors import BadInput
from infra.core.jsonfiles import read_json, write_json
from infra.engines.script import SUMMARY
from infra.runs.attempts import ATTEMPTS
from infra.runs.ledger import LEDGER, make_ledger
from infra.runs.lineage import (
    CONFIG,
    GUIDE,
    RECEIPT,
    config_hash,
    damage_line,
    diff_runs,
    find_run,
    list_runs,
    make_receipt,
    manifest_hash,
    write_guide,
    write_receipt,
)
from infra.runs.record import RECORD
from tests.fakes.ledgers import CPU_NODE, attempt
from tests.unit.infra.runs.test_record import dead_owner


def test_the_manifest_hash_is_the_staged_versions(tmp_path):
    version = tmp_path / "datasets" / "digits" / "v-0123abcd"
    version.mkdir(parents=True)
    assert manifest_hash(str(version)) == "0123abcd"  # from the folder's name
    (version / ".manifest.jsonl").write_text(json.dumps({"format": 2, "version": "fedcba98"}) + '\n["a.png"]\n')
    assert manifest_hash(str(version)) == "fedcba98"  # from the manifest itself
    assert manifest_hash("synthetic") is None and manifest_hash("/mnt/fileserver/datasets/x/current") is None


def receipt_of(tmp_path, run_id: str, seed: int = 0, digest: str = "ab" * 32, **training) -> dict:
    cfg = load_config(None, {"workdir": tmp_path, "training": {"seed": seed, **training}}, environ={})
    metrics = {
        "world_size": 2,
        "parameter_digest": digest,
        "status": "complete",
        "model": "resnet18",
        "final_val_top1": 0.5,
        "wall_seconds": 30.0,
    }
    out = tmp_path / "runs" / run_id
    write_json(out / RECORD, {"run_id": run_id, "status": "complete"})
    write_json(out / "metrics.json", metrics)
    ledger = make_ledger(CPU_NODE, {"upload-scripts": 0.0}, [], [attempt(1, "completed", 7200.0)])
    write_json(out / LEDGER, ledger)
    receipt = make_receipt(cfg, run_id, "inputs-1", "scripts/v1", "synthetic", None, metrics, ledger)
    return write_receipt(out, cfg, receipt)


def test_a_receipt_holds_the_runs_lineage_and_the_config_beside_it(tmp_path):
    receipt = receipt_of(tmp_path, "run-a", seed=7)
    assert json.loads((tmp_path / "runs" / "run-a" / RECEIPT).read_text()) == receipt
    assert {
        k: receipt[k]
        for k in (
            "run_id",
            "dataset",
            "data_manifest",
            "scripts",
            "image",
            "inputs",
            "seed",
            "world_size",
            "parameter_digest",
        )
    } == {
        "run_id": "run-a",
        "dataset": "digits",
        "data_manifest": None,
        "scripts": "scripts/v1",
        "image": None,
        "inputs": "inputs-1",
        "seed": 7,
        "world_size": 2,
        "parameter_digest": "ab" * 32,
    }
    config = json.loads((tmp_path / "runs" / "run-a" / CONFIG).read_text())
    assert config["training"]["seed"] == 7
    assert receipt["config_hash"] == config_hash(
        load_config(None, {"workdir": tmp_path, "training": {"seed": 7}}, environ={})
    )


def test_the_runs_are_listed_as_they_ended_with_accuracy_time_cost_and_receipt(tmp_path):
    receipt_of(tmp_path, "run-b")
    receipt_of(tmp_path, "run-a")
    os.utime(tmp_path / "runs" / "run-b" / RECORD, (1e9, 2e9))  # ended last
    (tmp_path / "runs" / "not-a-run").mkdir()  # no run.json: not listed
    rows = list_runs(tmp_path / "runs")
    assert [r["run_id"] for r in rows] == ["run-a", "run-b"]  # by when their records were last written
    assert {k: rows[0][k] for k in ("status", "val_top1", "seconds", "node_hours", "cost", "currency")} == {
        "status": "complete",
        "val_top1": 0.5,
        "seconds": 30.0,
        "node_hours": 2.0,
        "cost": 1.5,
        "currency": "USD",
    }
    assert rows[0]["receipt"]["parameter_digest"] == "ab" * 32
    assert list_runs(tmp_path / "nowhere") == []


def test_a_run_whose_records_are_damaged_says_which_file_and_the_fix(tmp_path):
    receipt_of(tmp_path, "run-a")
    folder = tmp_path / "runs" / "run-a"
    (folder / RECORD).write_text('{"status": "compl')  # cut short, as a full disk or a crash leaves it
    (folder / "metrics.json").write_text("[1, 2]")  # JSON, but not a mapping
    (row,) = list_runs(tmp_path / "runs")
    assert row["damaged"] == [RECORD, "metrics.json"] and row["status"] == "damaged"
    assert damage_line(row, tmp_path / "runs") == (
        f"run run-a: run.json, metrics.json in {folder} cannot be read; restore it from the run's copy on the file "
        "share (results/run-a/), or remove the run's folder"
    )


def test_a_run_is_named_by_its_id_or_an_unambiguous_prefix(tmp_path):
    for run_id in ("3f2a-1", "3f2a-2", "77b0"):
        write_json(tmp_path / run_id / RECORD, {"status": "complete"})
    assert find_run(tmp_path, "77").name == "77b0" and find_run(tmp_path, "3f2a-1").name == "3f2a-1"
    with pytest.raises(BadInput, match=r"run '3f2a' is ambiguous: it begins 3f2a-1, 3f2a-2; give more of the id"):
        find_run(tmp_path, "3f2a")
    with pytest.raises(
        BadInput, match=r"no run 'ff' under .*; `trainflow runs --workdir .*` lists the runs there"
    ) as e:
        find_run(tmp_path, "ff")
    assert e.value.exit_code == 2


def test_the_diff_names_each_field_that_differs_and_no_other(tmp_path):
    receipt_of(tmp_path, "run-a", seed=1)
    receipt_of(tmp_path, "run-b", seed=2, digest="cd" * 32)
    rows = {r["field"]: (r["a"], r["b"]) for r in diff_runs(tmp_path / "runs" / "run-a", tmp_path / "runs" / "run-b")}
    assert rows["receipt.seed"] == (1, 2) and rows["config.training.seed"] == (1, 2)
    assert rows["receipt.parameter_digest"] == ("ab" * 32, "cd" * 32) and rows["receipt.run_id"] == ("run-a", "run-b")
    assert "receipt.config_hash" in rows
    assert "receipt.scripts" not in rows and "metrics.model" not in rows and "ledger.cost" not in rows
    assert diff_runs(tmp_path / "runs" / "run-a", tmp_path / "runs" / "run-a") == []


def test_the_receipt_and_the_list_of_runs_count_every_attempt_at_training(tmp_path):
    cfg = load_config(None, {"workdir": tmp_path}, environ={})
    out = tmp_path / "runs" / "resumed"
    write_json(out / RECORD, {"run_id": "resumed", "status": "complete"})
    ledger = make_ledger(
        CPU_NODE, {"run-training": 0.0}, [], [attempt(1, "killed", 1800.0), attempt(2, "completed", 5400.0)]
    )
    write_json(out / LEDGER, ledger)
    receipt = make_receipt(cfg, "resumed", "inputs-1", "scripts/v1", "synthetic", None, {}, ledger)
    assert receipt["cost"] == {
        "training_seconds": 7200.0,
        "attempts": [
            {"attempt": 1, "ended": "killed", "seconds": 1800.0},
            {"attempt": 2, "ended": "completed", "seconds": 5400.0},
        ],
        "node_hours": 2.0,
        "gpu_hours": 0.0,
        "cost": 1.5,
        "currency": "USD",
        "lost_gpu_hours": 0.0,
    }
    write_receipt(out, cfg, receipt)
    stopped = tmp_path / "runs" / "stopped"  # killed outright, not resumed yet: no ledger, as it stands
    write_json(stopped / RECORD, {"run_id": "stopped", "status": "running", "owner": dead_owner()})
    killed = {
        "attempt": 1,
        "flow_run": "f",
        "owner": dead_owner(),
        "started": 1e9,
        "seen": 1e9 + 42,
        "ended": "running",
    }
    write_json(stopped / ATTEMPTS, {"attempts": [killed]})
    receipt_of(tmp_path, "fresh")
    rows = {r["run_id"]: r for r in list_runs(tmp_path / "runs")}
    assert (rows["resumed"]["training_seconds"], rows["resumed"]["node_hours"], rows["resumed"]["cost"]) == (
        7200.0,
        2.0,
        1.5,
    )
    assert [a["ended"] for a in rows["resumed"]["attempts"]] == ["killed", "completed"]
    assert rows["stopped"]["attempts"] == [{"attempt": 1, "ended": "killed", "seconds": 42.0}]
    assert rows["stopped"]["status"] == "interrupted"  # its run.json still says running: nothing ran to say otherwise
    assert read_json(stopped / RECORD)["status"] == "running"  # listing writes nothing
    assert rows["stopped"]["training_seconds"] == 42.0 and rows["stopped"]["node_hours"] is None
    fields = {r["field"] for r in diff_runs(out, tmp_path / "runs" / "fresh")}
    assert "receipt.run_id" in fields and not any(f.startswith("receipt.cost") for f in fields)  # ledger.* says it


def test_the_run_folder_says_which_file_is_what(tmp_path):
    for name in ("model.keras", "metrics.json", "plot.svg", LEDGER, RECEIPT, "extra.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "logs").mkdir()
    write_guide(tmp_path, "model.keras")
    lines = (tmp_path / GUIDE).read_text().splitlines()
    listed = [line.split("`")[1] for line in lines if line.startswith("- ")]
    assert listed == ["model.keras", "metrics.json", "plot.svg", LEDGER, RECEIPT, "logs", GUIDE, "extra.txt"]
    assert "- `model.keras`: the trained model" in lines[4] and "checkpoints" not in "\n".join(lines)


def script_run(tmp_path, run_id: str, args: list[str], final: dict) -> None:
    """A run folder of a user's script as the flow leaves it: its record and script.json."""
    folder = tmp_path / "runs" / run_id
    write_json(folder / RECORD, {"status": "complete", "run_id": run_id})
    summary = {"kind": "script", "entry": "train.py", "args": args, "source": "/src", "requirements": ["numpy"]}
    write_json(
        folder / SUMMARY, {**summary, "launcher": "torchrun", "world_size": 2, "wall_seconds": 9.5, "final": final}
    )


def test_script_runs_are_listed_beside_the_trainers_and_diffed_by_what_ran_and_their_metrics(tmp_path):
    script_run(tmp_path, "run-s", ["--epochs", "2"], {"loss": 0.5})
    script_run(tmp_path, "run-t", ["--epochs", "3"], {"loss": 0.25})
    receipt_of(tmp_path, "run-a")
    rows = {row["run_id"]: row for row in list_runs(tmp_path / "runs")}
    assert rows["run-s"]["model"] == "script: train.py --epochs 2" and rows["run-s"]["world_size"] == 2
    assert rows["run-s"]["seconds"] == 9.5 and rows["run-s"]["script"]["requirements"] == ["numpy"]
    assert rows["run-a"]["script"] is None
    diff = {r["field"]: (r["a"], r["b"]) for r in diff_runs(tmp_path / "runs" / "run-s", tmp_path / "runs" / "run-t")}
    assert diff == {"script.args": (["--epochs", "2"], ["--epochs", "3"]), "script.final.loss": (0.5, 0.25)}


def test_a_killed_run_against_a_finished_one_says_it_was_interrupted_first(tmp_path):
    from typer.testing import CliRunner

    from cli import app

    receipt_of(tmp_path, "run-a")
    write_json(tmp_path / "runs" / "run-k" / RECORD, {"run_id": "run-k", "status": "interrupted"})  # no receipt
    rows = {r["field"]: (r["a"], r["b"]) for r in diff_runs(tmp_path / "runs" / "run-k", tmp_path / "runs" / "run-a")}
    assert rows["run.status"] == ("interrupted", "complete")
    shown = CliRunner().invoke(app, ["runs", "diff", "run-k", "run-a", "--workdir", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[0] == "run run-k (A) is interrupted: what it had not written yet shows as -"
