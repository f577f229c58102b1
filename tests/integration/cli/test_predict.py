"""`trainflow predict` as a user runs it, on models the real trainers trained here (one short PyTorch run, in this
process, and one Keras run): its predictions on the digits' val/ folder agree with the run's own validation top-1;
a run id names its model; a bad image is named and skipped; every bad input is one line and exit 2."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cli import app
from infra.engines import installed
from infra.engines.contract import PACKAGE
from trainer.train import main as engine_main

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("predict")]  # one training per framework

TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
# 30 steps at 16 px: about half the digits right (what the agreement needs: a model that tells them apart), in
# seconds; the PIL loader, whose evaluation transform predict applies
SHORT = [
    *("--model", "resnet18", "--image-size", "16", "--batch-size", "32", "--epochs", "1", "--steps-per-epoch", "30"),
    *("--lr", "0.02", "--warmup-epochs", "0", "--min-crop-scale", "0.5", "--no-hflip", "--checkpoint-every", "0"),
    *("--threads", "2"),
]
RUN_ID = "4d2f9a61c0b84e3a"


@pytest.fixture(scope="module")
def torch_run(digits, tmp_path_factory) -> Path:
    """The results folder of a short PyTorch run on the digits."""
    out = tmp_path_factory.mktemp("torch-run") / "out"
    argv = ["--data", str(digits), "--out", str(out), *SHORT, "--loader", "pil", "--loader-workers", "0"]
    assert engine_main(argv) == 0
    return out


@pytest.fixture(scope="module")
def keras_run(digits, tmp_path_factory) -> Path:
    """The results folder of a short Keras run (model.fit) on the digits, run as its launcher runs it."""
    out = tmp_path_factory.mktemp("keras-run") / "out"
    argv = [sys.executable, str(PACKAGE / "tf" / "fit.py"), "--data", str(digits), "--out", str(out), *SHORT]
    done = subprocess.run([*argv, "--loader-workers", "2"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TRAINFLOW, *args], capture_output=True, text=True, timeout=300)


def invoke(*args: str):
    """`trainflow ARGS` in this process (its stdout and stderr apart)."""
    return CliRunner().invoke(app, list(args))


def check_agreement(predictions: list[dict], out: Path) -> None:
    """The share of val/ images whose top-1 class is their folder's is the run's final val top-1 (to one image)."""
    right = sum(p["top"][0]["class"] == Path(p["file"]).parent.name for p in predictions)
    recorded = json.loads((out / "metrics.json").read_text())["final_val_top1"]
    assert abs(right - recorded * len(predictions)) <= 1, (right, len(predictions), recorded)
    assert 0.2 < recorded < 1  # a model that tells the digits apart, not one that names one class for all


def test_pytorch_predictions_on_the_val_folder_agree_with_the_run_s_validation(torch_run, digits):
    result = run_cli("predict", "--model", str(torch_run / "model.pt"), str(digits / "val"), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    predictions = json.loads(result.stdout)
    assert len(predictions) == len(list((digits / "val").rglob("*.png")))
    assert all(len(p["top"]) == 5 and p["top"][0]["probability"] >= p["top"][1]["probability"] for p in predictions)
    check_agreement(predictions, torch_run)


def test_keras_predictions_agree_too_and_a_bad_image_is_named_and_skipped(keras_run, digits, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    result = run_cli("predict", "--model", str(keras_run / "model.keras"), str(digits / "val"), str(bad), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"cannot decode {bad}: ") and line.endswith("; skipped"), line
    predictions = json.loads(result.stdout)
    assert str(bad) not in {p["file"] for p in predictions}
    check_agreement(predictions, keras_run)


@pytest.fixture
def workdir(torch_run, tmp_path) -> Path:
    """A workdir whose runs/ holds the PyTorch run, as a finished run's folder."""
    folder = tmp_path / "w" / "runs" / RUN_ID
    shutil.copytree(torch_run, folder, ignore=shutil.ignore_patterns("checkpoints"))
    (folder / "run.json").write_text(json.dumps({"run_id": RUN_ID, "status": "complete"}))
    return tmp_path / "w"


def test_a_run_id_prefix_names_its_model_and_csv_and_the_table_show_the_top_k(workdir, digits, tmp_path):
    files = [str(digits / "val" / "3" / name) for name in sorted(os.listdir(digits / "val" / "3"))[:2]]
    written = invoke(
        "predict",
        "--model",
        RUN_ID[:6],
        "--workdir",
        str(workdir),
        *files,
        "--top-k",
        "3",
        "--csv",
        str(tmp_path / "p.csv"),
    )
    assert written.exit_code == 0, written.output
    rows = list(csv.reader((tmp_path / "p.csv").open()))
    assert rows[0] == ["file", "class_1", "p_1", "class_2", "p_2", "class_3", "p_3"]
    assert [row[0] for row in rows[1:]] == files

    table = invoke("predict", "--model", str(workdir / "runs" / RUN_ID / "model.pt"), files[0], "--top-k", "3")
    assert table.exit_code == 0, table.output
    top1, p1 = rows[1][1], float(rows[1][2])
    assert files[0] in table.stdout and f"{top1} {p1:.2%}" in table.stdout and "top 3" in table.stdout


def test_every_image_mode_is_classified_as_training_reads_it(torch_run, image_tree):
    result = invoke("predict", "--model", str(torch_run / "model.pt"), str(image_tree), "--json", "--top-k", "1")
    assert result.exit_code == 0 and result.stderr == "", result.output
    files = {Path(p["file"]).name for p in json.loads(result.stdout)}
    assert files == {
        "gray.png",
        "cmyk.jpg",
        "rgba.png",
        "palette transparent.png",
        "日本語 名前.png",
        "plain.JPEG",
        "v1.png",
        "v2.png",
    }  # and not .DS_Store


def keras_like(path: Path) -> Path:
    """A file with a Keras model's members (config.json, model.weights.h5), without TensorFlow."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        for name in ("metadata.json", "config.json", "model.weights.h5"):
            archive.writestr(name, "{}")
    return path


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model", "{model}", "{dir}/empty"], ["no images in", "empty"]),
        (["--model", "{dir}/notes.pt", "{image}"], ["--model", "notes.pt cannot be read as PyTorch weights"]),
        (["--model", "{dir}/nowhere.pt", "{image}"], ["--model", "nowhere.pt: no such file"]),
        (["--model", "{dir}/bare.pth", "{image}"], ["bare.pth holds bare weights"]),
        (["--model", "0123abcd", "--workdir", "{dir}/w", "{image}"], ["'0123abcd' is neither a file nor a run"]),
        (["--model", "{model}", "{image}", "--top-k", "0"], ["--top-k 0: give 1 or more"]),
        (["--model", "{model}", "{dir}/notes.txt"], ["no images to classify: the one file given cannot be decoded"]),
    ],
    ids=["empty-folder", "not-a-model", "missing-model", "bare-weights", "unknown-run", "top-k-0", "only-a-non-image"],
)
def test_bad_input_is_one_line_and_exit_2(torch_run, digits, tmp_path, args, words):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.pt").write_text("not a model")
    (tmp_path / "notes.txt").write_text("not an image")
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "bare.pth")
    image = next((digits / "val" / "0").iterdir())
    model = torch_run / "model.pt"
    result = invoke("predict", *(a.format(dir=tmp_path, model=model, image=image) for a in args))
    assert result.exit_code == 2, result.output
    *before, line = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and all(w in line for w in words), result.stderr
    named = f"cannot decode {tmp_path / 'notes.txt'}: cannot identify image file; skipped"
    assert before == ([named] if args[-1].endswith("notes.txt") else []), result.stderr


def test_a_keras_model_without_tensorflow_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(installed, "has_module", lambda name: name not in ("tensorflow", "tf_keras"))
    image = tmp_path / "x.png"
    image.write_bytes(b"")
    result = invoke("predict", "--model", str(keras_like(tmp_path / "model.keras")), str(image))
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: --model {tmp_path / 'model.keras'} is a Keras model: classifying with it needs TensorFlow and "
        "tf_keras, which this venv lacks; install it with `make setup-tensorflow` (about 1.4 GB, a minute)"
    ]
