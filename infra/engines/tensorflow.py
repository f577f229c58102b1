"""The TensorFlow and Keras engines: containers/trainer/tf/loop.py (a custom loop with Horovod's
DistributedGradientTape) and containers/trainer/tf/fit.py (Keras `model.fit` with Horovod's optimizer and
callbacks, on tf_keras), both started by horovodrun, both in the TensorFlow image (containers/tf-*.Dockerfile).

Their section of the config subclasses their trainer's options declaration (trainer/tf/options.py: the options every
framework shares, with the same defaults as PyTorch's), as PyTorch's does (infra/engines/options.py).
"""

from argparse import Namespace
from typing import ClassVar, Literal

from infra.engines.options import ParsedSettings
from nodelib.errors import UsageError
from trainer.tf.options import TensorFlowOptions, check_args


class TensorFlowTraining(TensorFlowOptions, ParsedSettings):
    """How the TensorFlow trainer runs: the workers under horovodrun, and every option of trainer/tf/loop.py
    (`python containers/trainer/tf/loop.py --help`), with its defaults: the ResNet-50-on-ImageNet reference case."""

    ENTRY: ClassVar[str] = "trainer/tf/loop.py"
    MODEL_FILE: ClassVar[str] = "model.keras"
    IMAGE_STACK: ClassVar[str] = "tf-"
    LAYERS: ClassVar[tuple[str, ...]] = ("tensorflow",)
    framework: Literal["tensorflow"] = "tensorflow"
    """The training framework (an engine of infra/engines): tensorflow."""
    launcher: Literal["torchrun", "horovodrun"] = "horovodrun"
    """horovodrun (Horovod over Gloo locally, MPI/NCCL on GPU nodes): TensorFlow trains under Horovod only."""

    def check(self, args: Namespace) -> None:
        if self.launcher != "horovodrun":
            raise UsageError(
                f"training.framework {self.framework} trains under horovodrun only (torchrun starts PyTorch "
                f"workers): set training.launcher: horovodrun, or leave it unset"
            )
        check_args(args)


class KerasTraining(TensorFlowTraining):
    """How the Keras trainer runs: the workers under horovodrun, and every option of trainer/tf/fit.py
    (`python containers/trainer/tf/fit.py --help`), with its defaults: the ResNet-50-on-ImageNet reference case."""

    ENTRY: ClassVar[str] = "trainer/tf/fit.py"
    framework: Literal["keras"] = "keras"  # type: ignore[assignment]  # each engine's own tag, as pydantic needs
    """The training framework (an engine of infra/engines): keras."""
