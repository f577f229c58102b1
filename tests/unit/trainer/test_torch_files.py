"""PyTorch's weights files read without torch (trainer/torch_files.py), as the TensorFlow and Keras trainers read
them, against torch.load; torchvision's ImageNet weights as those trainers name them."""

import os
import pickle
import zipfile

import numpy as np
import pytest
import torch
import torchvision

from nodelib.errors import UsageError
from trainer.model_files import IMAGENET_URLS
from trainer.tf.options import MODEL_NAMES
from trainer.torch_files import read_torch_file


def test_a_run_s_model_file_reads_as_torch_load_reads_it(tmp_path):
    model = torchvision.models.resnet18(num_classes=3)
    model.layer1[0].bn1.running_var.uniform_(0.5, 2.0)  # not the initial ones
    path = tmp_path / "model.pt"
    whole = {"arch": "resnet18", "classes": ["a", "b", "c"], "image_size": 32, "state_dict": model.state_dict()}
    torch.save(whole, path)
    read = read_torch_file(path, "--init-from")
    assert {k: v for k, v in read.items() if k != "state_dict"} == {k: v for k, v in whole.items() if k != "state_dict"}
    expected = torch.load(path, weights_only=True)["state_dict"]
    assert list(read["state_dict"]) == list(expected)
    for name, tensor in expected.items():
        assert np.array_equal(read["state_dict"][name], tensor.numpy()), name
    assert (
        read["state_dict"]["fc.weight"].dtype == np.float32
        and read["state_dict"]["bn1.num_batches_tracked"].shape == ()
    )


def test_a_view_with_an_offset_and_strides_reads_as_its_values(tmp_path):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    torch.save({"t": base.t()[1:, 2:], "h": torch.ones(3, dtype=torch.float16)}, tmp_path / "views.pt")
    read = read_torch_file(tmp_path / "views.pt", "--init-from")
    assert np.array_equal(read["t"], base.t()[1:, 2:].numpy()) and read["h"].dtype == np.float16


class Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_pickle_that_would_run_code_is_refused_and_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("evil/data.pkl", pickle.dumps({"fc.weight": Payload()}))
    with pytest.raises(UsageError, match="posix.system is not part of a weights file|os.system is not part"):
        read_torch_file(path, "--init-from")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("content", [b"not a zip", b"PK\x03\x04broken"])
def test_a_file_that_torch_did_not_write_is_one_line(tmp_path, content):
    (tmp_path / "w.pt").write_bytes(content)
    with pytest.raises(UsageError, match=r"w.pt cannot be read as PyTorch weights"):
        read_torch_file(tmp_path / "w.pt", "--init-from")


def test_the_tensorflow_trainers_imagenet_files_are_torchvisions_defaults():
    assert set(IMAGENET_URLS) == set(MODEL_NAMES)
    for name, url in IMAGENET_URLS.items():
        assert url == torchvision.models.get_model_weights(name).DEFAULT.url, name


@pytest.mark.parametrize("trainer", ["pytorch", "tensorflow and keras"])
def test_a_cached_imagenet_file_cut_short_or_another_is_refused_naming_it_and_the_fix(tmp_path, monkeypatch, trainer):
    """torch.hub checks only what it downloads: a file placed where the download would go is checked by every
    trainer against the SHA-256 prefix of its name (no network is used)."""
    from trainer.model_files import imagenet_file
    from trainer.models import imagenet_weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cached = tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"PK\x03\x04 the first bytes of a download cut short")
    with pytest.raises(UsageError) as caught:
        (imagenet_weights if trainer == "pytorch" else imagenet_file)("resnet18")
    message = str(caught.value)
    assert message.startswith(f"--init-from imagenet: {cached} is not torchvision's file of that name (its SHA-256")
    assert "its name says f37072fd): it is cut short or another file; delete it" in message


def test_a_torchscript_archive_or_a_whole_pickled_model_is_refused_with_the_fix_not_an_unsafe_load(tmp_path):
    from trainer.models import read_torch

    model = torch.nn.Linear(3, 2)
    torch.jit.save(torch.jit.script(model), tmp_path / "scripted.pt")
    torch.save(model, tmp_path / "pickled.pt")
    with pytest.raises(UsageError, match=r"scripted.pt is a TorchScript archive \(torch.jit.save\), a program, not w"):
        read_torch(tmp_path / "scripted.pt", "--model")
    with pytest.raises(UsageError) as caught:
        read_torch(tmp_path / "pickled.pt", "--model")
    assert "it is a whole pickled model, not its weights: save its state_dict() with torch.save" in str(caught.value)
    assert "weights_only" not in str(caught.value)
