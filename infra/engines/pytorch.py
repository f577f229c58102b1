"""The PyTorch engine: containers/trainer/train.py, started by torchrun (torch.distributed) or horovodrun.

Its section of the config subclasses the trainer's own options declaration (trainer/options.py: `PyTorchOptions`, see
infra/engines/options.py): every option is a setting with the trainer's type, default, choices and help, and the
trainer's own checks (`check_args`, `check_layout`, the model's name) validate it, so the two cannot drift apart.
"""

from argparse import Namespace
from typing import ClassVar, Literal

from infra.engines.options import ParsedSettings
from nodelib.errors import UsageError
from trainer.options import TORCHVISION_MODELS, PyTorchOptions, check_args, check_layout, check_model_in


class PyTorchTraining(PyTorchOptions, ParsedSettings):
    """How the PyTorch trainer runs: the launcher, the workers, and every option of train.py
    (`python containers/trainer/train.py --help`), with its defaults: the ResNet-50-on-ImageNet reference case."""

    ENTRY: ClassVar[str] = "trainer/train.py"
    MODEL_FILE: ClassVar[str] = "model.pt"
    IMAGE_STACK: ClassVar[str] = ""
    framework: Literal["pytorch"] = "pytorch"
    """The training framework (an engine of infra/engines): pytorch."""

    def replicas(self) -> tuple[int, int]:
        return (self.workers // self.stages, self.stages) if self.parallel == "pipeline" else (self.workers, 1)

    def check(self, args: Namespace) -> None:
        if self.launcher == "horovodrun" and args.backend == "auto":
            args.backend = "horovod"
        check_args(args)
        check_model_in(args.model, TORCHVISION_MODELS)  # by name only: the trainer's preflight builds it
        check_image_size(args.model, args.image_size)
        if self.parallel == "pipeline":
            check_layout(self.workers, self.stages, self.batch_size, self.microbatches)


# The image sizes some of torchvision's classifiers cannot take, whatever the batch (a forward pass in training mode,
# torchvision 0.29; tests/unit/infra/engines/test_image_sizes.py keeps them true): refused with the config, before
# anything starts. The trainer's preflight, a step on a tiny batch, finds any other misfit.
IMAGE_SIZES: dict[str, tuple[int, int | None]] = {
    **dict.fromkeys(("vit_b_16", "vit_b_32", "vit_h_14", "vit_l_16", "vit_l_32"), (224, 224)),
    "maxvit_t": (221, 224),
    "inception_v3": (299, None),  # its auxiliary classifier, which trains with it
    "alexnet": (63, None),
}


def check_image_size(model: str, size: int) -> None:
    """Refuse an image size that the model cannot take (IMAGE_SIZES)."""
    low, high = IMAGE_SIZES.get(model, (1, None))
    if low <= size and (high is None or size <= high):
        return
    takes = f"{low} px or more" if high is None else f"{high} px" if low == high else f"{low} to {high} px"
    raise UsageError(
        f"{model} takes images of {takes}, not --image-size {size}; set --image-size {high or low} or pick another "
        "--model"
    )
