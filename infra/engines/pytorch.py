"""The PyTorch engine: containers/trainer/train.py, started by torchrun (torch.distributed) or horovodrun.

Its section of the config is made from the trainer's own argument parser (trainer/options.py): every option is a
setting with the trainer's default, choices and help, and the trainer's own checks (`check_args`, `check_layout`)
validate it, so the two cannot drift apart.
"""

import argparse
import re
from argparse import Namespace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, create_model, model_validator

from infra.engines.contract import TrainingSettings
from trainer.errors import UsageError
from trainer.options import build_parser, check_args, check_layout

# Set by the flow for each run, or the preflight's own: not settings.
PER_RUN = {"help", "data", "out", "check", "check_workers"}
FLAG = re.compile(r"--([a-z][a-z-]*)")


class PyTorchSettings(TrainingSettings):
    """The orchestrator's settings of a PyTorch run; the trainer's options are added from its parser below."""

    ENTRY: ClassVar[str] = "trainer/train.py"
    framework: Literal["pytorch"] = "pytorch"
    """The training framework (an engine of infra/engines): pytorch."""

    @model_validator(mode="after")
    def _the_trainer_accepts_it(self) -> "PyTorchSettings":
        args = self.namespace()
        if self.launcher == "horovodrun" and args.backend == "auto":
            args.backend = "horovod"
        try:
            check_args(args)
            if self.parallel == "pipeline":
                check_layout(self.workers, self.stages, self.batch_size, self.microbatches)
        except UsageError as exc:
            raise ValueError(setting_names(str(exc))) from None
        return self

    def namespace(self) -> Namespace:
        """These settings as the trainer's parsed arguments."""
        return Namespace(**self.model_dump(exclude=set(PyTorchSettings.model_fields)))

    def trainer_args(self) -> list[str]:
        args = []
        for name, value in vars(self.namespace()).items():
            flag = "--" + name.replace("_", "-")
            if value == "":  # unset (--tracking-uri): the trainer's default
                continue
            if isinstance(value, bool):
                args.append(flag if value else f"--no-{flag[2:]}")
            else:
                args += [flag, str(value)]
        return args


def setting_names(message: str) -> str:
    """A trainer message with its option names (--batch-size) as the config's (training.batch_size); the world
    size is training.workers."""
    message = message.replace("the world size", "training.workers")
    return FLAG.sub(lambda m: "training." + m.group(1).replace("-", "_"), message)


def option_fields(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """(type, Field) of every trainer option that is a setting: its default, its choices, its help."""
    fields: dict[str, Any] = {}
    for action in parser._actions:  # argparse has no public list of a parser's options
        if action.dest in PER_RUN:
            continue
        kind: Any
        if action.choices:
            kind = Literal[tuple(action.choices)]
        elif isinstance(action, argparse.BooleanOptionalAction):
            kind = bool
        else:
            kind = action.type or str
        fields[action.dest] = (kind, Field(action.default, description=action.help))
    return fields


if TYPE_CHECKING:  # fields made at run time: the type checker knows the class they extend
    PyTorchTraining = PyTorchSettings
else:
    PyTorchTraining = create_model(
        "PyTorchTraining", __base__=PyTorchSettings, __module__=__name__, **option_fields(build_parser())
    )
PyTorchTraining.__doc__ = (
    "How the PyTorch trainer runs: the launcher, the workers, and every option of train.py "
    "(`python containers/trainer/train.py --help`), with its defaults: the ResNet-50-on-ImageNet reference case."
)
