"""A trainer's options as settings: every engine's section of the config subclasses its trainer's typed options
declaration (trainer/options.py: `PyTorchOptions`, `TensorFlowOptions`), so the option, its type, its default, its
choices and its help have one home (the trainer) and cannot drift, and the type checker sees every setting.

`ParsedSettings` is the base of such a section: the declaration's attributes become fields (their `Help` their
descriptions), the section turns back into the trainer's arguments (`trainer_args`), and the trainer's own checks
validate it (`check`), their messages naming the config's settings (training.batch_size) instead of the trainer's
options (--batch-size).
"""

import re
from argparse import Namespace
from typing import Any

from pydantic import model_validator

from infra.engines.contract import TrainingSettings
from nodelib.errors import UsageError
from trainer.options import Help, check_batch_fits

FLAG = re.compile(r"--([a-z][a-z-]*)")


class ParsedSettings(TrainingSettings):
    """A training section whose trainer options come from the trainer's declaration: a subclass names it first,
    `class PyTorchTraining(PyTorchOptions, ParsedSettings)`."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Each option's `Help` is its setting's description (the schema, the reference pages)."""
        super().__pydantic_init_subclass__(**kwargs)
        for field in cls.model_fields.values():
            for help_ in (m for m in field.metadata if isinstance(m, Help)):
                field.description = help_.text
        cls.model_rebuild(force=True)

    @model_validator(mode="after")
    def _the_trainer_accepts_it(self) -> "ParsedSettings":
        try:
            self.check(self.namespace())
        except UsageError as exc:
            raise ValueError(setting_names(str(exc))) from None
        return self

    def replicas(self) -> tuple[int, int]:
        """(data-parallel replicas, the workers of each): one worker each, unless an engine splits the model."""
        return self.workers, 1

    def check_batch(self, images: int, where: str) -> None:
        """Refuse a batch that `images` training images (in `where`) cannot give every replica each epoch: the
        trainer's rule (check_batch_fits), in the config's words."""
        try:
            replicas, stages = self.replicas()
            check_batch_fits(self.namespace().batch_size, replicas, images, stages, where=f" in {where}")
        except UsageError as exc:
            raise UsageError(setting_names(str(exc))) from None

    def check(self, args: Namespace) -> None:
        """The trainer's own checks of its arguments (UsageError); an engine adds those of its launcher."""
        raise NotImplementedError

    def namespace(self) -> Namespace:
        """These settings as the trainer's parsed arguments."""
        return Namespace(**self.model_dump(exclude=set(TrainingSettings.model_fields)))

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
