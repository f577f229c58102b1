"""The model names the orchestrator checks without importing torch or TensorFlow are the trainers' own: each list
equals what its trainer builds, and a config naming an unknown model is refused at load, by name, with neither
framework imported."""

import subprocess
import sys

import torchvision

from tests.fakes.paths import REPO
from trainer.options import TORCHVISION_MODELS
from trainer.tf.options import MODEL_NAMES

LOAD = """
import sys
from flows.config import ConfigError, load_config
try:
    load_config(None, {{"training": {{"framework": "{framework}", "model": "{model}"}}}}, environ={{}})
except ConfigError as exc:
    print(exc)
print(sorted(m for m in ("torch", "torchvision", "tensorflow", "tf_keras") if m in sys.modules))
"""


def test_the_torchvision_names_are_the_pinned_torchvision_s_classifiers():
    assert tuple(sorted(torchvision.models.list_models(module=torchvision.models))) == TORCHVISION_MODELS


def test_the_tensorflow_names_are_the_models_its_trainers_build():
    from trainer.tf import models  # imports tf_keras: only here

    assert tuple(models.MODELS) == MODEL_NAMES


def load(framework: str, model: str) -> list[str]:
    """What loading a config with this framework and model prints: its error, then the frameworks it imported."""
    code = LOAD.format(framework=framework, model=model)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_an_unknown_model_is_refused_at_load_naming_close_ones_without_importing_a_framework():
    assert load("pytorch", "resnet5000") == [
        "invalid config: unknown model 'resnet5000' (training.model); pick a torchvision classifier such as "
        "resnet101, resnet152, resnet18, resnet34, resnet50, resnext101_32x8d, resnext101_64x4d, resnext50_32x4d",
        "[]",
    ]
    assert load("keras", "vit_b_16")[0].startswith(
        "invalid config: unknown model 'vit_b_16' (training.model) for the TensorFlow and Keras trainers; pick one "
        "of resnet18, resnet34"
    )
    assert load("pytorch", "vit_b_16") == ["[]"]  # a torchvision classifier: accepted
