"""The docker backend's nodes: containers of the training image, joined by a Docker network of their own.

Nodes as containers: N containers of the training image on a Docker network of their own.

Each container is a node, as on a cluster: it runs sshd, knows the others by name (node0, node1, ...)
and mounts the data and the scripts share read-only and the results folder read-write. horovodrun on node0 starts the
workers of the other nodes over SSH with a key made for this run, as Horovod does on Azure ML and
Batch clusters. Everything carries the label trainflow.run=<run id>, so what a crashed run left
behind can be found and removed.
"""

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from docker.errors import APIError, NotFound

from infra.compute.base import owner
from infra.engines.launchers import horovodrun_options, torchrun_options
from infra.engines.program import IMAGE_RUNTIME, NodePaths, Program
from infra.images.registry import DockerEngine, ImageError

LABEL = "trainflow.run"
OWNER = "trainflow.owner"  # host:pid of the process that made the pool; a pool whose owner is gone is a leftover
SSH_PORT = 2222
TORCH_PORT = 29500  # torchrun's rendezvous on node0 (each pool has a network of its own)
NODE_ENV = {"GLOO_SOCKET_IFNAME": "eth0"}  # the nodes' network, not loopback, for Gloo's connections
DATA, RESULTS, SCRIPTS = "/data", "/results", "/scripts"  # the file server, the results, the scripts share
KEYS = "/etc/trainflow/ssh"
# The node's start-up: install this run's key, trust the other nodes, and serve SSH in the foreground.
NODE_START = (
    f"mkdir -p /root/.ssh && cp {KEYS}/id_ed25519 /root/.ssh/ && cp {KEYS}/id_ed25519.pub /root/.ssh/authorized_keys"
    " && printf 'Host *\\n  StrictHostKeyChecking no\\n  UserKnownHostsFile /dev/null\\n  LogLevel ERROR\\n"
    f"  Port {SSH_PORT}\\n' > /root/.ssh/config && chmod 700 /root/.ssh && chmod 600 /root/.ssh/*"
    f" && ssh-keygen -A -q && exec /usr/sbin/sshd -D -e -p {SSH_PORT}"
)


@dataclass
class Mount:
    """A host folder mounted into every node."""

    source: Path
    target: str
    read_only: bool = True


@dataclass
class ContainerNodes:
    """Running nodes: their containers by name, and the network that joins them."""

    engine: DockerEngine
    run_id: str
    names: list[str] = field(default_factory=list)

    @property
    def network(self) -> str:
        return f"trainflow-{self.run_id}"

    def container(self, index: int) -> str:
        return f"trainflow-{self.run_id}-node{index}"

    def start(self, index: int, argv: list[str], env: dict[str, str] | None = None) -> tuple[str, Iterator[bytes]]:
        """Start `argv` on node `index`; returns the exec's id and its output as it comes."""
        api = self.engine.api
        exec_id = api.exec_create(self.container(index), argv, environment=env or {}, workdir=IMAGE_RUNTIME)["Id"]
        return exec_id, api.exec_start(exec_id, stream=True)

    def exec_lines(self, argv: list[str], env: dict[str, str] | None = None) -> tuple[Iterator[str], Callable[[], int]]:
        """Run `argv` on node0; returns its output lines (as they come) and a function giving its exit status."""
        exec_id, chunks = self.start(0, argv, env)
        return split_lines(chunks), lambda: self.engine.api.exec_inspect(exec_id)["ExitCode"]


def split_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Whole lines (with their newline) out of a stream of byte chunks."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode(errors="replace") + "\n"
    if pending:
        yield pending.decode(errors="replace") + "\n"


@contextmanager
def running_nodes(
    engine: DockerEngine, image: str, count: int, run_id: str, mounts: list[Mount], shm_size: str = "1g"
) -> Iterator[ContainerNodes]:
    """Start `count` nodes of `image` joined by a network of their own; remove all of it at the end."""
    try:
        yield start_nodes(engine, image, count, run_id, mounts, shm_size)
    finally:
        remove_nodes(engine, run_id)


def start_nodes(
    engine: DockerEngine, image: str, count: int, run_id: str, mounts: list[Mount], shm_size: str = "1g"
) -> ContainerNodes:
    """Start `count` nodes of `image` on a network of their own and wait until they reach each other."""
    nodes = ContainerNodes(engine, run_id)
    remove_nodes(engine, run_id)  # what an earlier crashed run with this id left behind
    try:
        labels = {LABEL: run_id, OWNER: owner()}
        engine.client.networks.create(nodes.network, driver="bridge", labels=labels)
        with tempfile.TemporaryDirectory(prefix="trainflow-ssh-") as keys:
            write_key_pair(Path(keys))
            volumes = {
                str(m.source.resolve()): {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in mounts
            }
            volumes[keys] = {"bind": KEYS, "mode": "ro"}
            for index in range(count):
                name = f"node{index}"
                engine.client.containers.run(
                    image,
                    ["sh", "-c", NODE_START],
                    name=nodes.container(index),
                    hostname=name,
                    detach=True,
                    network=nodes.network,
                    labels=labels,
                    volumes=volumes,
                    shm_size=shm_size,
                )
                nodes.names.append(name)
            wait_for_sshd(nodes, count)
    except APIError as exc:
        raise ImageError(f"starting {count} nodes of {image} failed: {exc.explanation or exc}") from None
    return nodes


def wait_for_sshd(nodes: ContainerNodes, count: int, attempts: int = 100) -> None:
    """Wait until node0 can reach every node over SSH (sshd starts within a second or two)."""
    check = " && ".join(f"ssh -o ConnectTimeout=2 node{i} true" for i in range(count))
    for _ in range(attempts):
        lines, status = nodes.exec_lines(["sh", "-c", check])
        output = "".join(lines)
        if status() == 0:
            return
        time.sleep(0.2)
    raise ImageError(f"the nodes of run {nodes.run_id} did not accept SSH: {output.strip()[-500:]}")


def write_key_pair(folder: Path) -> None:
    """An ed25519 key pair for this run's node-to-node SSH (never reused, removed with the nodes)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (folder / "id_ed25519").write_bytes(private)
    (folder / "id_ed25519.pub").write_bytes(public + b"\n")
    folder.chmod(0o755)


def remove_nodes(engine: DockerEngine, run_id: str) -> int:
    """Remove every container and network labelled with `run_id`; returns how many containers went."""
    selector: dict[str, str | list[str] | bool] = {"label": f"{LABEL}={run_id}"}
    containers = engine.client.containers.list(all=True, filters=selector)
    for container in containers:
        try:
            container.remove(force=True)
        except NotFound:
            pass
    for network in engine.client.networks.list(filters=selector):
        try:
            network.remove()
        except NotFound:
            pass
    return len(containers)


def horovod_on_nodes(program: Program, hosts: str, paths: NodePaths) -> list[str]:
    """horovodrun on node0: the program's workers on `hosts` (name:slots,...), Gloo over the nodes' network (eth0)."""
    return [
        "horovodrun",
        *horovodrun_options(program.workers, hosts, "eth0"),
        "-p",
        str(SSH_PORT),
        "python",
        *program.rank_argv(paths),
    ]


def torchrun_layout(workers: int, slots: int) -> tuple[int, int]:
    """(nodes, workers per node) for torchrun on container nodes: as few nodes as `slots` allows, as many
    workers on each (torchrun starts the same number on every node)."""
    nodes = -(-workers // slots)
    if workers % nodes:
        raise ValueError(
            f"torchrun starts the same number of workers on every node, and training.workers {workers} "
            f"does not split evenly over the {nodes} nodes it needs with pool.slots_per_node {slots}; "
            "make training.workers a multiple of pool.slots_per_node"
        )
    return nodes, workers // nodes


def torchrun_on_nodes(program: Program, slots: int, paths: NodePaths) -> list[list[str]]:
    """One torchrun per node (the i-th for node i), meeting at node0; Gloo over the nodes' network (eth0)."""
    nodes, per_node = torchrun_layout(program.workers, slots)
    trainer = program.rank_argv(paths)
    return [
        [
            "python",
            "-m",
            "torch.distributed.run",
            *torchrun_options(nodes, per_node, rank, "node0", TORCH_PORT),
            *trainer,
        ]
        for rank in range(nodes)
    ]


def commands_on_nodes(program: Program, names: list[str], slots: int, paths: NodePaths) -> list[list[str]]:
    """The launcher commands, the i-th run on node i: horovodrun on node0 alone, or torchrun on each node."""
    if program.launcher == "horovodrun":
        return [horovod_on_nodes(program, ",".join(f"{name}:{slots}" for name in names), paths)]
    return torchrun_on_nodes(program, slots, paths)
