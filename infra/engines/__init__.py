"""Training frameworks (engines): which trainer runs, with which settings. One module per framework, registered
here, and nothing outside this package names one.

    pytorch      containers/trainer/train.py under torchrun or horovodrun    (infra/engines/pytorch.py)
    tensorflow   containers/trainer/tf/loop.py under horovodrun              (infra/engines/tensorflow.py)
    keras        containers/trainer/tf/fit.py under horovodrun               (infra/engines/tensorflow.py)

A framework module owns its section of the config (`training`, chosen by training.framework): its options,
defaults, help and checks, its trainer's entry point (ENTRY), the launchers that start it (training.launcher) and
its command line (`trainer_args`). Its trainer writes the one output format of contract.py, so progress, tracking,
the ledger and the reports are the same for every framework. Adding a framework is one module with a subclass of
`TrainingSettings` (`framework: Literal["<name>"]`) and one line in ENGINES below.

May import: infra.core, and of the trainer its contract modules and the options of each framework's trainer.
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import BeforeValidator, Field

from infra.engines.contract import TrainingSettings
from infra.engines.pytorch import PyTorchTraining
from infra.engines.tensorflow import KerasTraining, TensorFlowTraining

ENGINES: "dict[str, type[TrainingConfig]]" = {
    "pytorch": PyTorchTraining,
    "tensorflow": TensorFlowTraining,
    "keras": KerasTraining,
}
DEFAULT = "pytorch"

__all__ = ["DEFAULT", "ENGINES", "TrainingConfig", "default_training"]


def one_of(engines: Mapping[str, type[TrainingSettings]]) -> Any:
    """The type of the training section: the section of the engine that `framework` names (the default framework's
    when it names none), as the pool section is the backend's; with one engine, that engine's section."""
    if len(engines) == 1:  # pydantic would still put the tag in every error's location
        return next(iter(engines.values()))
    return Annotated[
        Union[tuple(engines.values())],  # noqa: UP007 - a Union of a tuple made at run time
        Field(discriminator="framework"),
        BeforeValidator(default_framework),
    ]


def default_framework(section: object) -> object:
    """A training section that names no framework is the default framework's."""
    return {"framework": DEFAULT, **section} if isinstance(section, dict) else section


if TYPE_CHECKING:  # the section as the type checker sees it: one of the engines' (pydantic's is made at run time
    # from ENGINES); a new engine is one line here and one in ENGINES
    TrainingConfig = PyTorchTraining | TensorFlowTraining | KerasTraining
else:
    TrainingConfig = one_of(ENGINES)


def default_training() -> TrainingConfig:
    """The training section when a config names none: the default framework's defaults."""
    return ENGINES[DEFAULT].model_validate({})
