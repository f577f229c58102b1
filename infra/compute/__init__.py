"""Compute backends: where the workers run. One module per backend, registered here, and nothing outside
this package names one.

    process   this machine, local worker processes             (infra/compute/process.py)
    docker    containers of the training image as nodes        (infra/compute/docker.py)
    azureml   an Azure ML compute cluster and a command job     (infra/compute/azureml.py)

A fourth backend (Azure Batch, Kubernetes, ...) is one module with a class that has the `Backend`
interface of infra/compute/base.py, and one line in BACKENDS below; its own settings, if any, become a
config section named after it.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.compute.azureml import AzureMLBackend
from infra.compute.base import JobConfig, JobTimedOut, Pool, PoolError, RunPaths, run_job, train_on_pool
from infra.compute.docker import DockerBackend
from infra.compute.process import ProcessBackend
from infra.core.errors import BadInput

BACKENDS = {backend.name: backend for backend in (ProcessBackend(), DockerBackend(), AzureMLBackend())}

__all__ = [
    "BACKENDS",
    "PoolConfig",
    "JobConfig",
    "JobTimedOut",
    "Pool",
    "PoolError",
    "RunPaths",
    "backend_of",
    "run_job",
    "train_on_pool",
]


class PoolConfig(BaseModel):
    """Where the workers run."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    backend: Literal[tuple(BACKENDS)] = "process"
    """process: local worker processes; docker: one container per node from the training image;
    azureml: an Azure ML compute cluster (settings in the azureml section)."""
    nodes: int = Field(1, ge=1)
    """Nodes in the pool (the process pool is always this one machine)."""
    slots_per_node: int = Field(2, ge=1)
    """Workers one node runs at most (azureml: GPUs per node, the processes each node starts)."""
    shm_size: str = "1g"
    """/dev/shm of each container node (data loaders share batches through it)."""


def backend_of(pool: PoolConfig):
    """The backend of a pool's config."""
    return BACKENDS[pool.backend]


def slots(pool: PoolConfig) -> int:
    """Workers the whole pool can run."""
    return backend_of(pool).nodes(pool) * pool.slots_per_node


def check_fits(pool: PoolConfig, workers: int) -> None:
    """Refuse more workers than the pool has slots, before anything starts."""
    if workers > slots(pool):
        raise BadInput(
            f"training.workers is {workers} but the {pool.backend} pool has {slots(pool)} slots "
            f"({backend_of(pool).nodes(pool)} node(s) x pool.slots_per_node {pool.slots_per_node}); "
            "lower training.workers or raise pool.nodes / pool.slots_per_node"
        )


def backend_sections() -> dict[str, tuple]:
    """(type, default) of each backend's own config section, by backend name."""
    return {name: (b.settings, b.settings()) for name, b in BACKENDS.items() if b.settings is not None}
