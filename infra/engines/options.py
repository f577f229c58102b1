"""A trainer's options as settings: every engine's section of the config is made from its trainer's own argument
parser, so the option, its default, its choices and its help have one home (the trainer) and cannot drift.

`ParsedSettings` is the base of such a section: its trainer's options become fields (`with_options`), the section
turns back into the trainer's arguments (`trainer_args`), and the trainer's own checks validate it (`check`), their
messages naming the config's settings (training.batch_size) instead of the trainer's options (--batch-size).
"""

import argparse
import re
from argparse import Namespace
from typing import Any, Literal, TypeVar

from pydantic import Field, create_model, model_validator

from infra.engines.contract import TrainingSettings
from trainer.errors import UsageError

# Set by the flow for each run, or the preflight's own: not settings.
PER_RUN = {"help", "data", "out", "check", "check_workers"}
FLAG = re.compile(r"--([a-z][a-z-]*)")
S = TypeVar("S", bound="ParsedSettings")


class ParsedSettings(TrainingSettings):
    """A training section whose trainer options come from the trainer's parser (see `with_options`)."""

    @model_validator(mode="after")
    def _the_trainer_accepts_it(self) -> "ParsedSettings":
        try:
            self.check(self.namespace())
        except UsageError as exc:
            raise ValueError(setting_names(str(exc))) from None
        return self

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


def with_options(base: type[S], parser: argparse.ArgumentParser, name: str, doc: str) -> type[S]:
    """`base` with a field for every option of the trainer's `parser` that is a setting. An engine module binds it
    under `if not TYPE_CHECKING` (the type checker cannot see fields made at run time: to it, the section is `base`)."""
    made = create_model(name, __base__=base, __module__=base.__module__, **option_fields(parser))
    made.__doc__ = doc
    return made


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
