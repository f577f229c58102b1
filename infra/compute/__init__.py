"""Compute backends: where the workers run. One module per backend, registered here, and nothing outside
this package names one.

    process   this machine, local worker processes             (infra/compute/process.py)
    docker    containers of the training image as nodes        (infra/compute/docker.py)
    azureml   an Azure ML compute cluster and a command job     (infra/compute/azureml/)

A fourth backend (Azure Batch, Kubernetes, ...) is one module with a class that has the `Backend` interface of
infra/compute/base.py and a pool section of its own (a `PoolSection` with `backend: Literal["<name>"]` and its
settings), registered below: the class in `registered`, the section in `PoolConfig`. The Azure templates that
make its cloud resources are in azure/.

May import: infra.storage, infra.images, infra.engines, infra.data, infra.services, infra.core, and the trainer's
contract modules (nodelib.staged).
"""

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from infra.compute.azureml import AzureMLBackend, AzureMLPoolConfig
from infra.compute.base import (
    Backend,
    JobConfig,
    JobTimedOut,
    Pool,
    PoolError,
    PoolSection,
    RunConfig,
    RunPaths,
    run_job,
    train_on_pool,
)
from infra.compute.docker import DockerBackend, DockerPoolConfig
from infra.compute.process import ProcessBackend, ProcessPoolConfig
from infra.core.errors import BadInput
from infra.engines.contract import TrainingSettings
from infra.engines.installed import missing_part

__all__ = [
    "BACKENDS",
    "AzureMLPoolConfig",
    "Backend",
    "DockerPoolConfig",
    "JobConfig",
    "JobTimedOut",
    "Pool",
    "PoolConfig",
    "PoolError",
    "PoolSection",
    "ProcessPoolConfig",
    "RunConfig",
    "RunPaths",
    "backend_of",
    "refuse_backend_sections",
    "run_job",
    "train_on_pool",
]


def registered() -> tuple[Backend[ProcessPoolConfig], Backend[DockerPoolConfig], Backend[AzureMLPoolConfig]]:
    """Every backend, each checked by the type checker against the interface with its own pool section."""
    return ProcessBackend(), DockerBackend(), AzureMLBackend()


BACKENDS: dict[str, Backend[Any]] = {backend.name: backend for backend in registered()}


def process_unless_named(pool: object) -> object:
    """A pool section that names no backend is the process pool's (the default, as before pool had sections)."""
    return {"backend": ProcessBackend.name, **pool} if isinstance(pool, dict) else pool


PoolConfig = Annotated[
    ProcessPoolConfig | DockerPoolConfig | AzureMLPoolConfig,
    Field(discriminator="backend"),
    BeforeValidator(process_unless_named),
]
"""The pool section: the section of the backend that `backend` names (process when it names none)."""


def backend_of(pool: PoolSection) -> Backend[Any]:
    """The backend of a pool's config."""
    return BACKENDS[pool.backend]


def slots(pool: PoolSection) -> int:
    """Workers the whole pool can run."""
    return backend_of(pool).nodes(pool) * pool.slots_per_node


def check_installed(pool: PoolSection, training: TrainingSettings) -> None:
    """Refuse a run whose workers need an install layer this venv lacks (infra/engines/installed.py), before anything
    starts: a pool that needs no image trains in this venv."""
    if not backend_of(pool).needs_image and (problem := missing_part(training)):
        raise BadInput(problem)


def refuse_backend_sections(values: dict) -> None:
    """Refuse a section named after a backend (the config format before its settings moved into `pool`)."""
    named = [name for name in BACKENDS if name in values]
    if named:
        raise ValueError(
            f"there is no {named[0]}: section: the {named[0]} pool's settings now live under pool:, with backend: "
            f"{named[0]} (TRAINFLOW_POOL__<SETTING>, not TRAINFLOW_{named[0].upper()}__<SETTING>); move them there"
        )
