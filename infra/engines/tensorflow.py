"""The TensorFlow and Keras engines: containers/trainer/tf/loop.py (a custom loop with Horovod's
DistributedGradientTape) and containers/trainer/tf/fit.py (Keras `model.fit` with Horovod's optimizer and
callbacks, on tf_keras), both started by horovodrun, both in the TensorFlow image (containers/tf-*.Dockerfile).

Their section of the config is made from their trainer's own parser (trainer/tf/options.py: the options every
framework shares, with the same defaults as PyTorch's), as PyTorch's is (infra/engines/options.py).
"""

from argparse import Namespace
from typing import TYPE_CHECKING, ClassVar, Literal

from infra.engines.options import ParsedSettings, with_options
from trainer.errors import UsageError
from trainer.tf.options import build_parser, check_args


class TensorFlowSettings(ParsedSettings):
    """The orchestrator's settings of a TensorFlow run; the trainer's options are added from its parser below."""

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


class KerasSettings(TensorFlowSettings):
    """The orchestrator's settings of a Keras run (tf_keras `model.fit` under Horovod)."""

    ENTRY: ClassVar[str] = "trainer/tf/fit.py"
    framework: Literal["keras"] = "keras"  # type: ignore[assignment]  # each engine's own tag, as pydantic needs
    """The training framework (an engine of infra/engines): keras."""


def doc(framework: str, entry: str) -> str:
    return (
        f"How the {framework} trainer runs: the workers under horovodrun, and every option of {entry} "
        f"(`python containers/{entry} --help`), with its defaults: the ResNet-50-on-ImageNet reference case."
    )


if TYPE_CHECKING:
    TensorFlowTraining = TensorFlowSettings
    KerasTraining = KerasSettings
else:
    TensorFlowTraining = with_options(
        TensorFlowSettings, build_parser("loop.py"), "TensorFlowTraining", doc("TensorFlow", TensorFlowSettings.ENTRY)
    )
    KerasTraining = with_options(
        KerasSettings, build_parser("fit.py"), "KerasTraining", doc("Keras", KerasSettings.ENTRY)
    )
