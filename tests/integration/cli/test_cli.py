"""The trainflow command as a user runs it: help everywhere, the digits command, the dry run, the smoke run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from infra.engines.gpus import visible_gpus
from nodelib.cores import usable_cores
from tests.fakes.bad_inputs import images, with_file

pytestmark = pytest.mark.integration  # the command as a user runs it

TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
QUICK = ["--model", "resnet18", "--epochs", "1", "--workers", "2", "--batch-size", "1"]


LEAVES = [["train"], ["stage"], ["data", "digits"], ["bench", "train"], ["bench", "staging"]]


@pytest.mark.parametrize(
    "command",
    [[], ["data"], ["bench"], ["build"], ["bench", "images"], ["run"], ["smoke"], ["bench", "parallel"], *LEAVES],
)
def test_every_command_has_help(command):
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output
    if command in LEAVES:
        for option in ("--config", "--data", "--workdir"):
            assert option in result.output


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400"}  # rich's tables unwrapped
    return subprocess.run([TRAINFLOW, *args], capture_output=True, text=True, timeout=300, env=env)


def test_a_corrupt_image_found_during_training_names_rank_and_file(tmp_path):
    with_file("train/a/bad.png", b"\x89PNG\r\n\x1a\n not really")(tmp_path)
    data = tmp_path / "data"
    config = tmp_path / "c.yaml"
    config.write_text("training: {preflight_images: false, image_size: 16, loader_workers: 1}\n")
    result = run_cli(
        "train", "--config", str(config), *QUICK[:-1], "2", "--data", str(data), "--workdir", str(tmp_path / "w")
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "failed: cannot decode image" in result.stderr and "bad.png" in result.stderr


def test_digits_command_writes_the_layout_once(tmp_path):
    first = run_cli("data", "digits", "--workdir", str(tmp_path))
    assert first.returncode == 0, first.stderr
    root = Path(first.stdout.strip())
    assert sorted(p.name for p in (root / "train").iterdir()) == [str(d) for d in range(10)]
    counts = [len(list((root / s).rglob("*.png"))) for s in ("train", "val")]
    assert sum(counts) == 1797 and counts[1] == 359
    again = run_cli("data", "digits", "--workdir", str(tmp_path))
    assert again.stdout == first.stdout


def test_the_cli_does_not_import_prefect_before_it_sets_prefects_settings():
    """Prefect reads its settings (home, timeouts) when first imported: the CLI sets them first."""
    code = "import sys, cli; sys.exit('prefect' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_dry_run_on_a_fresh_workdir_writes_nothing(tmp_path):
    done = run_cli("run", "--dry-run", "--workdir", str(tmp_path / "fresh"))
    assert done.returncode == 0, done.stderr
    for step in ("upload-scripts", "upload-dataset", "create-pool", "run-training", "collect-results"):
        assert step in done.stdout
    assert "write the digits set" in done.stdout and not (tmp_path / "fresh").exists()


def test_run_takes_workers_auto_and_a_batch_size_and_a_word_that_is_no_count_is_refused(tmp_path):
    done = run_cli("run", "--dry-run", "--workers", "auto", "--workdir", str(tmp_path / "w"))
    counted = visible_gpus() or usable_cores()  # this machine has no GPU: one a core
    assert done.returncode == 0 and f"process pool, {counted} slots for {counted} workers" in done.stdout, done.stderr
    batch = run_cli("run", "--dry-run", "--batch-size", "4", "--workdir", str(tmp_path / "w"))
    assert batch.returncode == 0 and "--batch-size 4 " in " ".join(batch.stdout.split()), batch.stderr
    bad = run_cli("run", "--dry-run", "--workers", "many", "--workdir", str(tmp_path / "w"))
    assert bad.returncode == 2 and "'many' is not a count: give a whole number of at least 1, or auto" in bad.stderr


def test_init_weights_cut_short_or_of_another_model_are_refused_before_anything_starts(tmp_path):
    import torch

    other = tmp_path / "resnet50-run.pt"
    torch.save({"arch": "resnet50", "state_dict": {"fc.bias": torch.zeros(2)}}, other)
    (tmp_path / "cut.pt").write_bytes(other.read_bytes()[:300])  # a copy cut short
    for given, says in (
        (other, f"error: --init-from {other} holds a resnet50 model, and this run trains resnet18: set training.model"),
        (tmp_path / "cut.pt", f"error: --init-from {tmp_path / 'cut.pt'} cannot be read as PyTorch weights"),
    ):
        done = run_cli("run", "--dry-run", "--init-from", str(given), "--workdir", str(tmp_path / "w"))
        assert done.returncode == 2 and done.stderr.startswith(says), done.stderr
        assert not (tmp_path / "w").exists()


@pytest.mark.slow  # a whole train-flow run: Prefect's server, Azurite, a training job
def test_smoke_runs_one_worker_on_synthetic_data_through_the_whole_pipeline(tmp_path):
    (tmp_path / "tiny.yaml").write_text(
        "training: {model: resnet18, image_size: 32, batch_size: 8, num_classes: 4, "
        "loader_workers: 0, threads: 1, warmup_epochs: 0}\n"
    )
    done = run_cli("smoke", "--config", str(tmp_path / "tiny.yaml"), "--workdir", str(tmp_path / "work"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "on 1 workers" in done.stdout and "results on the file share" in done.stdout
    metrics = next((tmp_path / "work" / "fileshare" / "results").glob("*/metrics.json")).read_text()
    assert '"data": "synthetic"' in metrics and '"global_step": 100' in metrics
    assert not (tmp_path / "work" / "fileserver").exists()  # nothing staged


def test_an_unchanged_rerun_says_which_steps_it_skipped_and_why(tmp_path):
    """Each step of a run prints what it did: a second run of the same command on the same data skips the scripts,
    the upload and the sync, and says why on each one's row."""
    images(tmp_path / "data", count=8)
    (tmp_path / "tiny.yaml").write_text(
        "training: {model: resnet18, image_size: 32, batch_size: 4, loader_workers: 0, threads: 1, warmup_epochs: 0}\n"
    )
    args = ("smoke", "--config", str(tmp_path / "tiny.yaml"), "--data", str(tmp_path / "data"))
    first = run_cli(*args, "--workdir", str(tmp_path / "work"))
    assert first.returncode == 0, first.stderr[-3000:]
    assert row_of(first.stdout, "upload-dataset")[:2] == ["upload-dataset", "ran"]
    again = run_cli(*args, "--workdir", str(tmp_path / "work"))
    assert again.returncode == 0, again.stderr[-3000:]
    for step in ("upload-scripts", "upload-dataset", "sync-to-file-server"):
        step_name, did, why = row_of(again.stdout, step)[:3]
        assert did == "skipped" and why, again.stdout
    assert row_of(again.stdout, "build-image")[1:3] == ["skipped", "nothing runs in an image on the process pool"]
    assert row_of(again.stdout, "run-training")[1] == "ran"


def row_of(output: str, step: str) -> list[str]:
    """The cells of `step`'s row in the table "what each step did" (rich's box characters split them)."""
    table = output[output.index("what each step did") :]
    line = next(line for line in table.splitlines() if f" {step} " in line)
    return [cell.strip() for cell in line.strip("│┃ ").split("│")]
