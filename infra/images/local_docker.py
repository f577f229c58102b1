"""A Docker engine, a registry with authentication and a base image, made on this machine.

For machines with no Docker Desktop, no reachable Docker Hub and no cloud registry (this project's
CI machine): dockerd and Distribution's registry come from Debian's packages (docker.io,
docker-registry; `make docker-setup` installs them), and the base image is a Debian root made with
debootstrap, with Python and the pinned torch installed in it.
"""

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import docker
from docker.errors import DockerException
from docker.types import Mount as DockerMount

from infra.images.build_context import CONTAINERS
from infra.images.registry import DockerEngine, ImageError, Log
from infra.services.supervise import ServiceError, free_port, port_open, running_service

DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = "python3,python3-venv,python3-pip,python3-dev,ca-certificates"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
REGISTRY_CONFIG = """version: 0.1
log: {{level: warn}}
storage:
  filesystem: {{rootdirectory: {root}}}
  delete: {{enabled: true}}
http: {{addr: "127.0.0.1:{port}"}}
auth:
  htpasswd: {{realm: trainflow, path: {htpasswd}}}
"""


def engine_answers(url: str | None = None) -> bool:
    """Whether a Docker engine answers at `url` (default: DOCKER_HOST or the local socket)."""
    try:
        client = docker.DockerClient(base_url=url, timeout=5) if url else docker.from_env(timeout=5)
        return bool(client.ping())
    except DockerException:
        return False


@contextmanager
def running_engine(log_dir: Path, startup_seconds: float = 60) -> Iterator[None]:
    """A Docker engine for the block: the one already running, else dockerd started here (and stopped after).

    dockerd runs as root with overlay2 storage in its usual data root (so its build cache outlives the
    run), without iptables or the default bridge (this machine has neither)."""
    if engine_answers():
        yield
        return
    binary = require_binary("dockerd", "docker.io")
    log_dir.mkdir(parents=True, exist_ok=True)
    with running_service(
        [binary, "--storage-driver=overlay2", "--iptables=false", "--bridge=none"],
        log_dir / "dockerd.log",
        engine_answers,
        "dockerd",
        startup_seconds,
    ):
        yield


@contextmanager
def running_registry(
    data_dir: Path, username: str, password: str, startup_seconds: float = 30, storage: Path | None = None
) -> Iterator[str]:
    """Distribution's registry on a free loopback port with htpasswd authentication; yields host:port. It stores
    what is pushed in `storage` (default: data_dir/storage).

    Docker talks plain HTTP to registries on 127.0.0.0/8, so no TLS set-up is needed."""
    binary = require_binary("docker-registry", "docker-registry")
    data_dir.mkdir(parents=True, exist_ok=True)
    htpasswd = data_dir / "htpasswd"
    htpasswd.write_text(f"{username}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=6)).decode()}\n")
    port = free_port()
    config = data_dir / "config.yml"
    config.write_text(REGISTRY_CONFIG.format(root=storage or data_dir / "storage", port=port, htpasswd=htpasswd))
    with running_service(
        [binary, "serve", str(config)],
        data_dir / "registry.log",
        lambda: port_open(port),
        "the registry",
        startup_seconds,
    ):
        yield f"localhost:{port}"


def collect_registry_garbage(data_dir: Path) -> None:
    """Delete, from the stopped registry of `data_dir`, every manifest no tag names and every blob no manifest uses
    (`registry garbage-collect --delete-untagged`, distribution's docs/garbage-collection.md)."""
    binary = require_binary("docker-registry", "docker-registry")
    subprocess.run(
        [binary, "garbage-collect", "--delete-untagged", str(data_dir / "config.yml")],
        capture_output=True,
        text=True,
        check=True,
    )


def require_binary(name: str, package: str) -> str:
    """The path of `name`, or an error saying which Debian package provides it."""
    path = shutil.which(name)
    if not path:
        raise ServiceError(f"{name} is not installed; run `make docker-setup` (apt-get install {package})")
    return path


def local_base_tag() -> str:
    """The local base image's name: a hash of its recipe."""
    pins = (CONTAINERS / "requirements" / "torch.txt").read_text()
    recipe = hashlib.sha256(f"bookworm\n{BASE_PACKAGES}\n{DEBIAN_MIRROR}\n{pins}".encode()).hexdigest()[:12]
    return f"trainflow-local/python-torch:{recipe}"


def local_base_image(engine: DockerEngine, log: Log) -> str:
    """A base image with Debian's Python 3.11 and the pinned torch in /opt/venv, made here once.

    Its tag is a hash of the recipe (packages, mirror, torch pins), so a changed pin makes a new one."""
    tag = local_base_tag()
    if engine.has_image(tag):
        return tag
    debian = f"trainflow-local/debian-python:{tag.rsplit(':', 1)[1]}"
    if not engine.has_image(debian):
        debootstrap_image(engine, debian, log)
    install_torch(engine, debian, tag, log)
    return tag


def debootstrap_image(engine: DockerEngine, name: str, log: Log) -> None:
    """Import a minimal Debian bookworm root with Python, made by debootstrap, as image `name`."""
    require_binary("debootstrap", "debootstrap")
    with tempfile.TemporaryDirectory(prefix="trainflow-base-") as tmp:
        root = Path(tmp) / "root"
        log("making a Debian bookworm root with Python (debootstrap, about a minute)")
        run_logged(
            ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(root), DEBIAN_MIRROR],
            log,
        )
        repository, tag = name.split(":")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        engine.api.import_image_from_stream(tar.stdout, repository=repository, tag=tag)
        tar.wait()


def install_torch(engine: DockerEngine, debian: str, tag: str, log: Log) -> None:
    """Install the pinned torch into /opt/venv in a container of `debian` and commit it as `tag`.

    pip reaches the index with the host's network and CA bundle (the index may sit behind a proxy
    whose certificate only the host trusts)."""
    log("installing the pinned torch into the base image (pip, a few minutes)")
    pins = " ".join(
        line
        for line in (CONTAINERS / "requirements" / "torch.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    container = engine.client.containers.run(
        debian,
        ["sh", "-c", f"python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir {pins}"],
        network_mode="host",
        detach=True,
        mounts=[DockerMount(str(HOST_CA_BUNDLE), str(HOST_CA_BUNDLE), type="bind", read_only=True)],
    )
    try:
        status = container.wait()["StatusCode"]
        if status != 0:
            tail = container.logs(tail=20).decode(errors="replace")
            raise ImageError(f"installing torch into the local base image failed (exit {status}):\n{tail}")
        container.commit(
            repository=tag.split(":")[0],
            tag=tag.split(":")[1],
            changes=["ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        )
    finally:
        container.remove(force=True)


def run_logged(command: list[str], log: Log) -> None:
    """Run a command; its last lines go into the error if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-10:])
        raise ImageError(f"{command[0]} failed (exit {done.returncode}):\n{tail}")
    log(f"{command[0]}: done")
