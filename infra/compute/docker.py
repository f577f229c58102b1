"""The docker backend: one container of the pushed training image per node, on a Docker network of its own.

Each node mounts the file share (its scripts versions at /scripts), the file server's data set version
read-only at /data, and the run's results folder at /results (infra/compute/docker_nodes.py). The job is
horovodrun on node0 (starting the other nodes' workers over SSH) or one torchrun per node; a node whose
command fails stops the others. Everything carries the run's label, so a later run finds and removes
what a crashed one left behind.
"""

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from infra.compute.base import (
    LocalBackend,
    OneAttempt,
    PoolError,
    PoolSection,
    RunConfig,
    RunPaths,
    merged_lines,
    owner_alive,
)
from infra.compute.docker_nodes import (
    DATA,
    LABEL,
    NODE_ENV,
    OWNER,
    RESULTS,
    SCRIPTS,
    ContainerNodes,
    Mount,
    commands_on_nodes,
    remove_nodes,
    split_lines,
    start_nodes,
    torchrun_layout,
)
from infra.core.errors import BadInput
from infra.engines.contract import SYNTHETIC, TrainingSettings
from infra.engines.program import IMAGE_RUNTIME, NodePaths, Program
from infra.images.registry import DockerEngine
from infra.images.requirements_layer import pip_check, pip_said


class DockerPoolConfig(PoolSection):
    """The docker pool: `nodes` containers of the training image on this machine's Docker engine."""

    backend: Literal["docker"] = "docker"
    shm_size: str = "1g"
    """/dev/shm of each container node (data loaders share batches through it)."""


@dataclass
class DockerPool:
    """Container nodes of the training image; the data, scripts and results folders are mounted into each."""

    pool: DockerPoolConfig
    run: RunPaths
    image: str
    docker_url: str | None = None
    nodes: ContainerNodes | None = field(default=None, repr=False)
    _engine: DockerEngine | None = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def engine(self) -> DockerEngine:
        """The Docker engine, reached on first use (the dry run makes a pool without one)."""
        if self._engine is None:
            self._engine = DockerEngine(self.docker_url)
        return self._engine

    @property
    def names(self) -> list[str]:
        return [f"node{i}" for i in range(self.pool.nodes)]

    def mounts(self) -> list[Mount]:
        """The scripts share, the results folder and (unless the data is synthetic) the data set version."""
        self.run.out.mkdir(parents=True, exist_ok=True)
        mounts = [Mount(self.run.scripts.parent, SCRIPTS), Mount(self.run.out, RESULTS, read_only=False)]
        return mounts + ([] if self.run.synthetic else [Mount(self.run.data, DATA)])

    def create(self) -> None:
        self.nodes = start_nodes(
            self.engine, self.image, self.pool.nodes, self.run_id, self.mounts(), self.pool.shm_size
        )

    def wait_until_ready(self) -> None:
        if self.nodes is None or len(self.nodes.names) != self.pool.nodes:
            raise PoolError(f"docker pool {self.run_id} is not running")

    def describe(self) -> dict:
        containers = self.engine.client.containers.list(all=True, filters={"label": f"{LABEL}={self.run_id}"})
        return {
            "backend": "docker",
            "run_id": self.run_id,
            "image": self.image,
            "slots": self.pool.slots_per_node * self.pool.nodes,
            "nodes": sorted(c.name for c in containers),
            "state": ",".join(sorted({c.status for c in containers})),
        }

    def delete(self) -> None:
        remove_nodes(self.engine, self.run_id)

    def delete_leftovers(self, keep: set[str]) -> list[str]:
        """Remove the containers of runs whose owning process is gone (crashed runs), other than `keep`."""
        found = set()
        for container in self.engine.client.containers.list(all=True, filters={"label": LABEL}):
            if not owner_alive(container.labels.get(OWNER, "")):
                found.add(container.labels[LABEL])
        gone = sorted(found - keep - {self.run_id})
        for run_id in gone:
            remove_nodes(self.engine, run_id)
        return gone

    def node_paths(self) -> NodePaths:
        """The scripts version under /scripts, the data at /data (or synthetic), results at /results, trainflow's
        node-side code in the image; checked on the nodes."""
        data = SYNTHETIC if self.run.synthetic else DATA
        scripts = f"{SCRIPTS}/{self.run.scripts.name}"
        return NodePaths(scripts, data, RESULTS, IMAGE_RUNTIME, self.pool.nodes, checked=False)

    def host_paths(self) -> NodePaths:
        """The same folders as this machine sees them (the mounts' sources)."""
        return NodePaths(str(self.run.scripts), str(self.run.data), str(self.run.out), nodes=self.pool.nodes)

    def job(self, program: Program, timeout_s: float = 0) -> "ContainerJob":
        paths = self.node_paths()
        commands = commands_on_nodes(program, self.names, self.pool.slots_per_node, paths)
        return ContainerJob(self, program, commands, {**program.environment(paths), **NODE_ENV})


@dataclass
class ContainerJob(OneAttempt):
    """The launcher commands on a docker pool, the i-th on node i. A node whose command fails stops the others."""

    pool: DockerPool
    program: Program
    commands: list[list[str]]
    env: dict[str, str]
    execs: list[str] = field(default_factory=list, repr=False)
    streams: list[Iterator[bytes]] = field(default_factory=list, repr=False)

    @property
    def nodes(self) -> ContainerNodes:
        """The pool's nodes (a job runs on a created pool)."""
        if self.pool.nodes is None:
            raise PoolError(f"docker pool {self.pool.run_id} is not running")
        return self.pool.nodes

    def describe(self) -> str:
        names = sorted(set(self.env) - set(NODE_ENV))
        commands = " | ".join(" ".join([f"node{i}:", *argv]) for i, argv in enumerate(self.commands))
        return commands + (f" (sets {', '.join(names)})" if names else "")

    def check(self) -> None:
        """The program's set-up on this machine (the folders mounted into the nodes), then the requirements it
        names, checked in the image on node0; a trainer checks its input on the nodes, where the data is."""
        if requirements := self.program.prepare(self.pool.host_paths()):
            check_image_requirements(self.nodes, requirements, self.pool.image)

    def submit(self) -> None:
        for index, command in enumerate(self.commands):
            exec_id, stream = self.nodes.start(index, command, self.env)
            self.execs.append(exec_id)
            self.streams.append(stream)

    def lines(self) -> Iterator[str]:
        return merged_lines([split_lines(stream) for stream in self.streams], self._stop_others_if_failed)

    def _stop_others_if_failed(self, index: int) -> None:
        """Called when node `index`'s output ends: a failed node fails the job at once."""
        for _ in range(100):  # its exit status follows the end of its output within moments
            if (code := self._exit_code(self.execs[index])) is not None:
                break
            threading.Event().wait(0.05)
        if code and any(self._exit_code(e) is None for e in self.execs):
            self.cancel()

    def _exit_code(self, exec_id: str) -> int | None:
        state = self.nodes.engine.api.exec_inspect(exec_id)
        return None if state["Running"] else state["ExitCode"]

    def poll(self) -> int | None:
        codes = [self._exit_code(e) for e in self.execs]
        return None if None in codes else next((c for c in codes if c), 0)

    def cancel(self) -> None:
        # On every node: SIGTERM to every process but the node's init (sshd), so launchers and workers stop.
        for index in range(len(self.nodes.names)):
            self.nodes.engine.api.exec_start(
                self.nodes.engine.api.exec_create(self.nodes.container(index), ["sh", "-c", "kill -TERM -1"])["Id"]
            )


def check_image_requirements(nodes: ContainerNodes, requirements: list[str], image: str) -> None:
    """Refuse requirements the image does not meet, with pip's own line: pip on node0 installing them from no index
    succeeds, installing nothing, exactly when the image already holds them."""
    lines, status = nodes.exec_lines(pip_check(requirements))
    said = list(lines)  # read to the end: the exit status follows
    if lacking := pip_said(status(), said):
        raise BadInput(
            f"the image {image} does not hold the script's requirements {', '.join(requirements)} ({lacking}); "
            "the build-image step layers them over the run's image: run the command again, and that step builds "
            "the layer"
        )


class DockerBackend(LocalBackend[DockerPoolConfig]):
    """Containers of the training image as nodes, on this machine's Docker engine."""

    name = "docker"
    needs_image = True
    reads_local_files = False  # its nodes see the mounted data, scripts and results folders only
    settings = DockerPoolConfig

    def check_world(self, pool: DockerPoolConfig, training: TrainingSettings) -> None:
        """Up to the pool's slots and, under torchrun, the same number of workers on every node it needs."""
        super().check_world(pool, training)
        if training.launcher == "torchrun":
            torchrun_layout(training.workers, pool.slots_per_node)

    def pool(self, cfg: RunConfig[DockerPoolConfig], run: RunPaths, image: str | None) -> DockerPool:
        return DockerPool(cfg.pool, run, image or "<image>", cfg.image.engine)
