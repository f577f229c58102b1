"""Command-line options of the TensorFlow and Keras trainers (tf/loop.py, tf/fit.py), and their checks.

The options every framework shares (trainer/options.py), declared again where their help differs for TensorFlow.
Neither TensorFlow nor torch is imported here: the orchestrator's config sections of both engines subclass this
declaration.
"""

import argparse
from typing import Annotated, Literal

from nodelib.errors import UsageError
from trainer.options import CommonOptions, Help, Workers, add_options, check_common_args

# The models of tf/models.py (torchvision's ResNets, built in Keras), named here so that the orchestrator checks
# training.model without importing TensorFlow; tests/unit/trainer/test_model_names.py keeps the two equal.
MODEL_NAMES = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "wide_resnet50_2", "wide_resnet101_2")


class TensorFlowOptions(CommonOptions):
    """The TensorFlow and Keras trainers' options: the common ones, with help that is true of TensorFlow."""

    OUT_HELP = "results folder: checkpoints, metrics.json, model.keras; resumed if it holds a checkpoint"

    model: Annotated[str, Help(f"a ResNet: {', '.join(MODEL_NAMES)} (torchvision's architectures, built in Keras)")] = (
        "resnet50"
    )
    loader_workers: Annotated[
        Workers,
        Help(
            "images decoded and augmented at once per training process, by tf.data's threads (auto or 0: as many "
            "as tf.data finds best)"
        ),
    ] = "auto"
    device: Annotated[
        Literal["auto", "cpu", "cuda"],
        Help("auto: a GPU when TensorFlow sees one (cuda: a GPU, as the PyTorch trainer names it)"),
    ] = "auto"
    precision: Annotated[
        Literal["auto", "bf16", "fp32"],
        Help(
            "auto: bf16 on a GPU (Keras's mixed_bfloat16 policy: bfloat16 compute, float32 variables), fp32 on the CPU"
        ),
    ] = "auto"
    threads: Annotated[
        int, Help("CPU threads of TensorFlow's op pools per worker; 0 shares the cores among the local workers")
    ] = 0


DESCRIPTIONS = {
    "loop.py": "Training of a ResNet with TensorFlow: a custom loop, data-parallel under Horovod.",
    "fit.py": "Training of a ResNet with Keras (tf_keras) model.fit, data-parallel under Horovod.",
}


def build_parser(prog: str = "loop.py") -> argparse.ArgumentParser:
    """The arguments of the trainer `prog` (loop.py or fit.py); defaults are the ResNet-50-on-ImageNet reference
    case, as PyTorch's."""
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTIONS.get(prog, DESCRIPTIONS["loop.py"]))
    add_options(p, TensorFlowOptions)
    return p


def check_args(args: argparse.Namespace) -> None:
    """Reject values that cannot train, naming the option and a valid range, and a model these trainers lack."""
    check_common_args(args)
    check_model_name(args.model)


def check_model_name(name: str) -> None:
    """Fail with the list of known names when `name` is not a model of the TensorFlow trainers."""
    if name not in MODEL_NAMES:
        raise UsageError(
            f"unknown model {name!r} (--model) for the TensorFlow and Keras trainers; pick one of "
            f"{', '.join(MODEL_NAMES)}"
        )
