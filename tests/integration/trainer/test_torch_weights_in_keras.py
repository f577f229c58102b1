"""The TensorFlow and Keras trainers start from PyTorch's weights (a PyTorch run's model.pt, torchvision's ImageNet
file), converted layer by layer: the Keras ResNet then computes what the torchvision one computes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torchvision

from infra.engines.contract import PACKAGE
from nodelib.scripts import sha256_file

pytestmark = pytest.mark.integration

# In one TensorFlow process (its import is the slow part), with torch unimportable as in the TensorFlow image: a
# resnet18 loaded from model.pt (same classes: every layer, the classifier too) scores the images; imagenet loads
# torchvision's file from torch's cache (the classifier new for 3 classes). No network here: the cached file is a
# stand-in of torchvision's, and its URL names it by its own digest (the trainer checks the digest a name carries).
CHECK = """
import json, sys
sys.modules["torch"] = sys.modules["torchvision"] = None
sys.path.insert(0, sys.argv[1])
import numpy as np
from trainer import model_files
model_files.IMAGENET_URLS["resnet18"] = "https://download.pytorch.org/models/" + sys.argv[4]
from trainer.tf.models import build_model, start_from
model = build_model("resnet18", 3, 32, 0)
loaded = start_from(model, sys.argv[2], "resnet18", ["a", "b", "c"])
images = np.load(sys.argv[3])
logits = model(images.transpose(0, 2, 3, 1), training=False).numpy()
fresh = build_model("resnet18", 3, 32, 0)
imagenet = start_from(fresh, "imagenet", "resnet18", ["a", "b", "c"])
print(json.dumps({"loaded": loaded, "imagenet": imagenet, "logits": logits.tolist()}))
"""


def test_a_pytorch_model_and_torchvision_s_imagenet_file_start_a_keras_resnet(tmp_path):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3)
    for module in model.modules():  # batch-norm statistics of a trained model, not the initial ones
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    torch.save(
        {"arch": "resnet18", "classes": ["a", "b", "c"], "state_dict": model.state_dict()}, tmp_path / "model.pt"
    )
    cache = tmp_path / "torch" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    stand_in = cache / "stand-in.pth"
    torch.save(torchvision.models.resnet18().state_dict(), stand_in)  # as downloaded, named as torch.hub names it
    cached = stand_in.rename(cache / f"resnet18-{sha256_file(stand_in)[:8]}.pth")
    images = np.random.default_rng(0).normal(size=(4, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)

    result = subprocess.run(
        [
            sys.executable,
            "-c",
            CHECK,
            str(PACKAGE.parent),
            str(tmp_path / "model.pt"),
            str(tmp_path / "images.npy"),
            cached.name,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TORCH_HOME": str(tmp_path / "torch"), "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["loaded"]["new"] == [] and out["loaded"]["loaded"] == out["loaded"]["tensors"]
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(images)).numpy()
    assert np.allclose(out["logits"], expected, atol=1e-4), np.abs(np.array(out["logits"]) - expected).max()
    assert out["imagenet"]["source"] == f"imagenet ({cached.name})"
    assert out["imagenet"]["new"] == ["fc/kernel:0", "fc/bias:0"]
    assert out["imagenet"]["loaded"] == out["imagenet"]["tensors"] - 2 == 100
