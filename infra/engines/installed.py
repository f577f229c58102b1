"""The install layers a run on this machine's own processes needs beyond the base one, and whether this venv has them.

`make demo` installs the base layer only (PyTorch, Prefect, the Azure SDKs, MLflow: what the local default runs);
TensorFlow with tf_keras, and Horovod (compiled against the frameworks installed), are layers of their own that a
command installs when it needs them. A run whose local workers need a missing layer is refused before anything
starts, with the one command that installs it. Found without importing anything (TensorFlow takes seconds).
"""

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from infra.engines.contract import TrainingSettings


@dataclass(frozen=True)
class Layer:
    """A part of the install that `make` adds on demand: what it is, the modules that tell it is there, the command
    that installs it and what that costs."""

    what: str
    modules: tuple[str, ...]
    command: str
    cost: str


LAYERS = {
    "tensorflow": Layer(
        "TensorFlow and tf_keras", ("tensorflow", "tf_keras"), "make setup-tensorflow", "about 1.4 GB, a minute"
    ),
    "horovod": Layer("Horovod", ("horovod",), "make setup-horovod", "compiled once, 4 to 10 minutes on 2 cores"),
}


def has_module(name: str) -> bool:
    """Whether `name` can be imported here (found, not imported)."""
    return importlib.util.find_spec(name) is not None


def horovod_has(framework_dir: str) -> bool:
    """Whether the installed Horovod was built with a framework's ops (horovod/torch or horovod/tensorflow holds its
    compiled library): a Horovod built before TensorFlow was installed lacks them."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(Path(p, framework_dir).glob("mpi_lib*.so") for p in spec.submodule_search_locations)


def needed(training: TrainingSettings) -> list[str]:
    """The layers the run's trainer and launcher need in this venv."""
    return [*training.LAYERS, *(["horovod"] if training.launcher == "horovodrun" else [])]


def missing_part(training: TrainingSettings) -> str | None:
    """The one line for the first layer the run needs that this venv lacks, or None."""
    who = f"training.framework {training.framework} with {training.launcher} on this machine"
    for name in needed(training):
        if problem := lacking(name, who):
            return problem
    if set(needed(training)) == {"tensorflow", "horovod"} and not horovod_has("tensorflow"):
        return (
            "Horovod here was built before TensorFlow was installed and lacks its ops; rebuild it with "
            f"`{LAYERS['horovod'].command}`"
        )
    return None


def lacking(name: str, who: str) -> str | None:
    """The one line for the layer `name` when this venv lacks it: `who` (what the user asked for) needs it, and the
    command that installs it; None when it is there."""
    layer = LAYERS[name]
    if all(has_module(m) for m in layer.modules):
        return None
    return f"{who} needs {layer.what}, which this venv lacks; install it with `{layer.command}` ({layer.cost})"
