"""Fine-tuning (--init-from): the real PyTorch trainer, in this process, on two halves of the digits set."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import torchvision

from nodelib.errors import UsageError
from trainer.models import build_model, start_from
from trainer.train import main as engine_main

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("init-from")]  # one pre-training for the module
SMALL = [
    *("--model", "resnet18", "--image-size", "32", "--batch-size", "32", "--lr", "0.02", "--warmup-epochs", "0"),
    *("--min-crop-scale", "0.5", "--no-hflip", "--loader-workers", "0", "--checkpoint-every", "0", "--threads", "2"),
]


def split(digits: Path, dest: Path, classes: str) -> Path:
    """The digits set's train and val folders of `classes` only."""
    for part in ("train", "val"):
        for c in classes:
            shutil.copytree(digits / part / c, dest / part / c)
    return dest


@pytest.fixture(scope="module")
def halves(digits, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(digits 0-4, digits 5-9, a model trained on 0-4 for 2 short epochs)."""
    root = tmp_path_factory.mktemp("halves")
    first, second = split(digits, root / "first", "01234"), split(digits, root / "second", "56789")
    assert (
        engine_main(
            ["--data", str(first), "--out", str(root / "pre"), "--epochs", "2", "--steps-per-epoch", "15", *SMALL]
        )
        == 0
    )
    return first, second, root / "pre" / "model.pt"


def one_short_epoch(data: Path, out: Path, *extra: str) -> dict:
    """metrics.json of 4 steps on `data`."""
    assert (
        engine_main(["--data", str(data), "--out", str(out), "--epochs", "1", "--steps-per-epoch", "4", *SMALL, *extra])
        == 0
    )
    return json.loads((out / "metrics.json").read_text())


def test_fine_tuning_an_earlier_run_beats_training_from_scratch(halves, tmp_path, capfd):
    _, second, model = halves
    scratch = one_short_epoch(second, tmp_path / "scratch")
    capfd.readouterr()
    tuned = one_short_epoch(second, tmp_path / "tuned", "--init-from", str(model))
    assert f"starting from {model}: 120 of 122 tensors loaded; new: fc.weight, fc.bias" in capfd.readouterr().out

    assert tuned["final_val_top1"] > scratch["final_val_top1"] + 0.1, (
        tuned["final_val_top1"],
        scratch["final_val_top1"],
    )
    assert scratch["init_from"] is None
    assert tuned["init_from"] == {"source": str(model), "loaded": 120, "tensors": 122, "new": ["fc.weight", "fc.bias"]}


def test_the_same_classes_keep_the_classifier_and_a_resumed_run_ignores_the_weights(halves, tmp_path, caplog):
    first, _, model = halves
    again = one_short_epoch(first, tmp_path / "again", "--init-from", str(model))
    assert again["init_from"]["new"] == [] and again["init_from"]["loaded"] == 122

    resumed = one_short_epoch(first, tmp_path / "again", "--init-from", str(model), "--epochs", "2")
    assert resumed["init_from"] is None and resumed["resumed_from_steps"]


def test_a_torchvision_weights_file_loads_by_name_and_shape(tmp_path):
    file = tmp_path / "resnet18-f37072fd.pth"
    torch.save(torchvision.models.resnet18(num_classes=1000).state_dict(), file)
    model = build_model("resnet18", 3)
    loaded = start_from(model, str(file), "resnet18", ["a", "b", "c"])
    assert loaded["new"] == ["fc.weight", "fc.bias"] and loaded["loaded"] == 120
    assert torch.equal(model.state_dict()["layer4.1.conv2.weight"], torch.load(file)["layer4.1.conv2.weight"])


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p / "missing.pt", ["missing.pt: no such file"]),
        (lambda p: p, ["is a folder, not a model file"]),
        (lambda p: write(p / "model.pt", b"PK\x03\x04 cut short"), ["cannot be read as PyTorch weights"]),
        (lambda p: write(p / "notes.pt", b"hello"), ["cannot be read as PyTorch weights"]),
        (
            lambda p: save(p / "model.pt", {"arch": "resnet34", "state_dict": {}}),
            ["holds a resnet34 model", "trains resnet18", "--model resnet34"],
        ),
        (
            lambda p: save(p / "resnet50-0676ba61.pth", torchvision.models.resnet50().state_dict()),
            ["holds a resnet50 model", "trains resnet18"],
        ),
        (
            lambda p: save(p / "weights.pth", torchvision.models.mobilenet_v3_small().state_dict()),
            ["another architecture than resnet18"],
        ),
        (lambda p: save(p / "model.pt", [1, 2]), ["holds no model weights"]),
        (lambda p: write(p / "model.keras", keras_like()), ["is a Keras model", "--framework keras"]),
    ],
    ids=[
        "missing",
        "folder",
        "corrupt",
        "not-torch",
        "other-arch",
        "torchvision-other-arch",
        "unnamed-other-arch",
        "no-weights",
        "keras",
    ],
)
def test_weights_that_cannot_start_a_run_are_one_line_naming_the_file(tmp_path, make, words):
    path = make(tmp_path)
    with pytest.raises(UsageError) as caught:
        start_from(build_model("resnet18", 10), str(path), "resnet18", [str(d) for d in range(10)])
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and all(w in message for w in words), message


def test_imagenet_that_cannot_be_downloaded_names_the_file_and_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # an empty cache: torch downloads (this machine cannot)
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")  # nothing listens there: refused at once
    with pytest.raises(UsageError) as caught:
        start_from(build_model("resnet18", 10), "imagenet", "resnet18", [str(d) for d in range(10)])
    message = str(caught.value)
    url = torchvision.models.ResNet18_Weights.DEFAULT.url
    assert url in message and str(tmp_path / "torch" / "hub" / "checkpoints" / Path(url).name) in message, message


def write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def save(path: Path, content) -> Path:
    torch.save(content, path)
    return path


def keras_like() -> bytes:
    """The members of a Keras model file (config.json, metadata.json, model.weights.h5), without TensorFlow."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in ("metadata.json", "config.json", "model.weights.h5"):
            archive.writestr(name, "{}")
    return buffer.getvalue()
