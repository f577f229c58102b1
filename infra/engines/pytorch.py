"""The PyTorch engine: containers/trainer/train.py, started by torchrun (torch.distributed) or horovodrun.

Its section of the config is made from the trainer's own argument parser (trainer/options.py, see
infra/engines/options.py): every option is a setting with the trainer's default, choices and help, and the
trainer's own checks (`check_args`, `check_layout`) validate it, so the two cannot drift apart.
"""

from argparse import Namespace
from typing import TYPE_CHECKING, ClassVar, Literal

from infra.engines.options import ParsedSettings, with_options
from trainer.options import build_parser, check_args, check_layout


class PyTorchSettings(ParsedSettings):
    """The orchestrator's settings of a PyTorch run; the trainer's options are added from its parser below."""

    ENTRY: ClassVar[str] = "trainer/train.py"
    MODEL_FILE: ClassVar[str] = "model.pt"
    IMAGE_STACK: ClassVar[str] = ""
    framework: Literal["pytorch"] = "pytorch"
    """The training framework (an engine of infra/engines): pytorch."""

    def check(self, args: Namespace) -> None:
        if self.launcher == "horovodrun" and args.backend == "auto":
            args.backend = "horovod"
        check_args(args)
        if self.parallel == "pipeline":
            check_layout(self.workers, self.stages, self.batch_size, self.microbatches)


DOC = (
    "How the PyTorch trainer runs: the launcher, the workers, and every option of train.py "
    "(`python containers/trainer/train.py --help`), with its defaults: the ResNet-50-on-ImageNet reference case."
)
if TYPE_CHECKING:
    PyTorchTraining = PyTorchSettings
else:
    PyTorchTraining = with_options(PyTorchSettings, build_parser(), "PyTorchTraining", DOC)
