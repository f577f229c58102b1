"""`trainflow doctor`: what this machine has, and what each feature needs, one row per part.

Each row says whether the part is there (with what was found) and, where it is not, the one command that fixes it.
The local default (`make demo`) needs Python, the base install, Node.js with Azurite and some free disk; a row it
needs that is missing makes the command exit 1. The other rows name the features they serve: partial JPEG decoding
(`--loader fast`), the docker pool and `make test`, GPUs, Horovod and TensorFlow.
"""

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.core.diskspace import free_bytes
from infra.engines.installed import LAYERS, has_module, horovod_has
from infra.runs.workdir import WorkdirError, check_workdir
from infra.services.azurite import REPO
from infra.services.prefect_server import api_answers

DEMO_BYTES = 1 << 30  # what a demo run writes under the workdir (the digits set, its copies, Prefect's database)


@dataclass(frozen=True)
class Row:
    """One part: the feature it serves, what was found ("" when missing), and the fix when it is missing."""

    part: str
    serves: str
    found: str
    fix: str = ""
    required: bool = False  # the local default needs it
    optional: bool = False  # its absence is no fault (no GPU: training runs on the CPU)

    @property
    def ok(self) -> bool:
        return bool(self.found)


def python_row() -> Row:
    version = ".".join(map(str, sys.version_info[:3]))
    fix = "" if sys.version_info >= (3, 11) else "install Python 3.11 or newer"
    return Row("Python", "everything", version if not fix else "", fix or "", required=True)


NODE_MAJOR = 20  # the oldest Node.js Azurite runs on here (its package.json declares 22; 20.20 runs it and the suite)


def node_row() -> Row:
    node, azurite = shutil.which("node"), REPO / "node_modules" / ".bin" / "azurite-blob"
    if node is None:
        return Row("Node.js and Azurite", "the local Blob storage", "", "install Node.js 20 or newer", required=True)
    version = command_output([node, "--version"])
    if problem := node_too_old(version):
        return Row("Node.js and Azurite", "the local Blob storage", "", problem, required=True)
    found = f"node {version}, Azurite in node_modules" if azurite.exists() else ""
    return Row("Node.js and Azurite", "the local Blob storage", found, "npm ci (make demo runs it)", required=True)


def node_too_old(version: str) -> str:
    """Why Node.js `version` (`node --version`: v20.20.2) cannot run Azurite, naming the fix; "" when it can."""
    major = version.lstrip("v").split(".")[0]
    if major.isdigit() and int(major) >= NODE_MAJOR:
        return ""
    return f"node {version or '(no version)'} is too old for Azurite: install Node.js {NODE_MAJOR} or newer"


def decoding_row() -> Row:
    from trainer import jpeg_crop  # imports torch: only when the row is asked for

    why = jpeg_crop.unavailable()
    fix = "sudo apt-get install gcc libjpeg-dev (Debian, Ubuntu)"
    return Row("C compiler and libjpeg", "partial JPEG decoding (--loader fast)", "" if why else "built", fix)


def docker_row() -> Row:
    docker = shutil.which("docker")
    engine = command_output([docker, "info", "--format", "{{.ServerVersion}}"]) if docker else ""
    registry = shutil.which("docker-registry") or shutil.which("registry")
    found = f"engine {engine}" + (", registry" if registry else "") if engine and registry else ""
    if docker and registry and not engine:  # installed, not running (or not reachable)
        fix = "Docker is installed but its engine does not answer: start it (sudo systemctl start docker, or dockerd)"
    else:
        fix = "sudo apt-get install docker.io docker-registry, then start dockerd (make test does both)"
    return Row("Docker engine and registry", "the docker pool, images, make test", found, fix)


def gpu_row() -> Row:
    import torch

    if not torch.cuda.is_available():
        return Row("CUDA GPUs and NCCL", "GPU training", "", "none here: training runs on the CPU", optional=True)
    names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return Row("CUDA GPUs and NCCL", "GPU training", f"{torch.cuda.device_count()} x {', '.join(names)}, NCCL {nccl}")


def horovod_row() -> Row:
    layer = LAYERS["horovod"]
    built = [name for name, folder in (("PyTorch", "torch"), ("TensorFlow", "tensorflow")) if horovod_has(folder)]
    found = f"built with {' and '.join(built)}" if has_module("horovod") and built else ""
    return Row("Horovod", "training.launcher horovodrun", found, layer.command)


def tensorflow_row() -> Row:
    layer = LAYERS["tensorflow"]
    found = "installed" if all(has_module(m) for m in layer.modules) else ""
    return Row("TensorFlow and tf_keras", "training.framework tensorflow and keras", found, layer.command)


def disk_row(workdir: Path) -> Row:
    try:
        check_workdir(workdir)
    except WorkdirError as exc:  # a file, or a folder this user cannot write: every command refuses it
        return Row("Free disk in the workdir", "staging, runs, Prefect's database", "", str(exc), required=True)
    free = free_bytes(workdir)
    found = f"{free / 1e9:.1f} GB free at {workdir}" if free >= DEMO_BYTES else ""
    fix = f"free 1 GB or more there, or pass --workdir on a bigger disk ({free / 1e9:.1f} GB free)"
    return Row("Free disk in the workdir", "staging, runs, Prefect's database", found, fix, required=True)


def ports_row(ui_port: int = 4200) -> Row:
    """Prefect's API: the one PREFECT_API_URL names, which must answer as Prefect's; else the UI's port free."""
    url = os.environ.get("PREFECT_API_URL")
    if url:
        answer = api_answers(url)
        fix = f"PREFECT_API_URL={url} does not answer as Prefect's API; unset it to use trainflow's own server"
        return Row("Prefect's API", "every command", f"{url} answers" if answer else "", fix, required=True)
    found = f"port {ui_port} free for trainflow ui" if port_free(ui_port) else ""
    return Row("Prefect's UI port", "trainflow ui", found, f"trainflow ui --port N (port {ui_port} is in use)")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def command_output(argv: list[str]) -> str:
    """A command's first line of output, or "" when it fails or takes more than 5 s."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""


CHECKS: list[Callable[[Path], Row]] = [
    lambda _: python_row(),
    lambda _: node_row(),
    disk_row,
    lambda _: ports_row(),
    lambda _: decoding_row(),
    lambda _: gpu_row(),
    lambda _: tensorflow_row(),
    lambda _: horovod_row(),
    lambda _: docker_row(),
]


def examine(workdir: Path) -> list[Row]:
    """Every row, in the order the table shows them."""
    return [check(workdir) for check in CHECKS]
