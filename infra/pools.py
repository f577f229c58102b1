"""Compute pools behind one interface: create, wait until ready, describe, delete.

- process: this machine as one node; its slots are local worker processes.
- docker: one container per node from the pushed image, on a Docker network of its own, with the file
  server's folder mounted read-only as the data and the scripts share mounted too
  (infra/container_nodes.py).

Every pool carries its run's id (a marker folder, or a container label), so a later run can find
and delete what a crashed run left behind.
"""

import json
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from infra.container_nodes import LABEL, OWNER, ContainerNodes, Mount, owner, owner_alive, remove_nodes, start_nodes
from infra.errors import StepError
from infra.fileshare import FileShareConfig, local_root
from infra.images import Engine


class PoolError(StepError):
    """A pool could not be created or used; `permanent` errors are not worth a retry."""


class PoolConfig(BaseModel):
    """Where the workers run."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    backend: Literal["process", "docker", "azureml"] = "process"
    """process: local worker processes; docker: one container per node from the training image;
    azureml: an Azure ML compute cluster (settings in the azureml section)."""
    nodes: int = Field(1, ge=1)
    """Nodes in the pool (the process pool is always this one machine)."""
    slots_per_node: int = Field(2, ge=1)
    """Workers one node runs at most (azureml: GPUs per node, the processes each node starts)."""
    shm_size: str = "1g"
    """/dev/shm of each container node (data loaders share batches through it)."""

    def slots(self) -> int:
        """Workers the whole pool can run."""
        return (1 if self.backend == "process" else self.nodes) * self.slots_per_node


def check_fits(cfg: PoolConfig, workers: int) -> None:
    """Refuse more workers than the pool has slots, before anything starts."""
    if workers > cfg.slots():
        raise PoolError(f"training.workers is {workers} but the {cfg.backend} pool has {cfg.slots()} slots "
                        f"({cfg.nodes if cfg.backend != 'process' else 1} node(s) x pool.slots_per_node "
                        f"{cfg.slots_per_node}); lower training.workers or raise pool.nodes / pool.slots_per_node",
                        permanent=True)


def scripts_root(cfg: PoolConfig, share: FileShareConfig, workdir: Path) -> Path:
    """Where the pool finds the file share that holds scripts/<version>: the local share's folder for the
    local pools, the root of the Azure Files datastore (a relative path) for Azure ML."""
    if cfg.backend == "azureml":
        if share.backend != "azure":
            raise PoolError("the azureml pool reads the scripts from the Azure Files share; set fileshare.backend: "
                            "azure (and azureml.datastore to the datastore registered for that share)", permanent=True)
        return Path()
    if share.backend != "local":
        raise PoolError(f"the {cfg.backend} pool runs the scripts from the local file share, but fileshare.backend "
                        "is azure; set fileshare.backend: local to train on this machine", permanent=True)
    return local_root(workdir)


class Pool(Protocol):
    """The one interface every pool backend has."""

    run_id: str

    def create(self) -> None: ...

    def wait_until_ready(self) -> None: ...

    def describe(self) -> dict: ...

    def delete(self) -> None: ...


@dataclass
class ProcessPool:
    """This machine as a pool of one node. Its marker folder records the run and the processes it runs."""

    cfg: PoolConfig
    run_id: str
    root: Path

    @property
    def folder(self) -> Path:
        return self.root / self.run_id

    def create(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "pool.json").write_text(json.dumps({LABEL: self.run_id, OWNER: owner(), "backend": "process"}))

    def wait_until_ready(self) -> None:
        if not (self.folder / "pool.json").exists():
            raise PoolError(f"process pool {self.run_id} was not created")

    def describe(self) -> dict:
        return {"backend": "process", "run_id": self.run_id, "nodes": ["localhost"], "slots": self.cfg.slots(),
                "state": "ready" if self.folder.exists() else "deleted"}

    def record_process(self, pid: int) -> None:
        """Remember a launcher's process group, so delete() stops it if it still runs."""
        with open(self.folder / "pids", "a") as f:
            f.write(f"{pid}\n")

    def delete(self) -> None:
        pids = self.folder / "pids"
        for line in (pids.read_text().split() if pids.exists() else []):
            try:
                os.killpg(int(line), signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class DockerPool:
    """Container nodes of the training image; the data and scripts folders are mounted into each."""

    cfg: PoolConfig
    run_id: str
    engine: Engine
    image: str
    mounts: list[Mount]
    nodes: ContainerNodes | None = field(default=None, repr=False)

    def create(self) -> None:
        self.nodes = start_nodes(self.engine, self.image, self.cfg.nodes, self.run_id, self.mounts, self.cfg.shm_size)

    def wait_until_ready(self) -> None:
        if self.nodes is None or len(self.nodes.names) != self.cfg.nodes:
            raise PoolError(f"docker pool {self.run_id} is not running")

    def describe(self) -> dict:
        containers = self.engine.client.containers.list(all=True, filters={"label": f"{LABEL}={self.run_id}"})
        return {"backend": "docker", "run_id": self.run_id, "image": self.image, "slots": self.cfg.slots(),
                "nodes": sorted(c.name for c in containers), "state": ",".join(sorted({c.status for c in containers}))}

    def delete(self) -> None:
        remove_nodes(self.engine, self.run_id)


def leftover_runs(root: Path, engine: Engine | None, keep: set[str]) -> set[str]:
    """Run ids of pools whose owning process is gone (crashed runs), other than those in `keep`."""
    found = set()
    for marker in root.glob("*/pool.json") if root.exists() else []:
        if not owner_alive(json.loads(marker.read_text()).get(OWNER, "")):
            found.add(marker.parent.name)
    if engine is not None:
        for container in engine.client.containers.list(all=True, filters={"label": LABEL}):
            if not owner_alive(container.labels.get(OWNER, "")):
                found.add(container.labels[LABEL])
    return found - keep


def delete_leftovers(root: Path, engine: Engine | None, keep: set[str]) -> list[str]:
    """Delete the pools of runs not in `keep` (left behind by crashed runs); returns their run ids."""
    gone = sorted(leftover_runs(root, engine, keep))
    for run_id in gone:
        ProcessPool(PoolConfig(), run_id, root).delete()
        if engine is not None:
            remove_nodes(engine, run_id)
    return gone
