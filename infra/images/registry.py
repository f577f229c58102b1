"""Training images: build with a Docker engine, push to a registry, pull by digest (docker-py).

The real registries are Azure Container Registry (<name>.azurecr.io) and Docker Hub (docker.io); the
tests use a local registry with htpasswd authentication. Passwords are handed in by the caller (from
the environment or a Prefect Secret block) and never reach a message or a log line.
"""

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.images import Image
from pydantic import BaseModel, ConfigDict, field_validator

from infra.core.errors import TrainflowError, first_line
from infra.core.redact import EnvName

# The grammar of github.com/distribution/reference: lowercase path components joined by / and a
# registry host[:port] in front.
PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY = re.compile(rf"^{PATH_COMPONENT}(?:/{PATH_COMPONENT})*$")
REGISTRY = re.compile(
    r"^(?:localhost|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)+|"
    r"\d{1,3}(?:\.\d{1,3}){3})(?::\d{1,5})?$|^localhost(?::\d{1,5})?$"
)
TAG = r"[\w][\w.-]{0,127}"
REFERENCE = re.compile(rf"^(?P<name>[^@\s]+?)(?::(?P<tag>{TAG}))?(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes in build output
Log = Callable[[str], None]


class ImageError(TrainflowError):
    """Building, pushing or pulling an image failed; `permanent` errors are not worth a retry."""


class ImageConfig(BaseModel):
    """The training image: which Dockerfile, which base, where it is pushed and with which credentials."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    flavour: Literal["cpu", "gpu"] = "cpu"
    """cpu: containers/cpu.Dockerfile (local pools, Gloo); gpu: containers/gpu.Dockerfile (CUDA, NCCL, MPI). The
    framework's image stack prefixes it: containers/tf-cpu.Dockerfile, tf-gpu.Dockerfile for TensorFlow and Keras."""
    registry: str | None = None
    """Registry host[:port], e.g. myregistry.azurecr.io, docker.io or localhost:5000; unset: no push,
    the image stays in the local engine."""
    repository: str | None = None
    """Repository in the registry (lowercase, / separated); unset: trainflow-<stack><flavour> (trainflow-cpu,
    trainflow-tf-cpu ...). Set, every framework's image goes there, told apart by its content tag."""
    base_image: str | None = None
    """Replaces the Dockerfile's pinned base. "local": a Debian base with Python, made on this machine with
    debootstrap (for machines that cannot pull images), with the pinned torch in it for PyTorch's image and without
    for TensorFlow's (whose framework comes from the build context's wheels)."""
    build_args: dict[str, str] = {}
    """More Dockerfile build arguments (they are part of the image's tag)."""
    build_network: str | None = None
    """Network of the build's RUN steps: "host" where the engine has no bridge network; unset: the default."""
    engine: str | None = None
    """Docker engine URL, e.g. unix:///var/run/docker.sock or tcp://host:2376; unset: DOCKER_HOST or the local
    socket."""
    username: str | None = None
    """Registry user (for ACR: the registry name, a token name or a service principal id); unset: push anonymously."""
    password_env: EnvName = "REGISTRY_PASSWORD"
    """Environment variable holding the registry password or token."""
    password_secret: str | None = None
    """Name of a Prefect Secret block with the password, used when the environment variable is unset."""
    python: str = "3.11"
    """The base image's Python version: the wheels put into the build context are fetched for it."""
    use: str | None = None
    """An image already built, e.g. myregistry.azurecr.io/trainflow-gpu:v3 or .../trainflow-gpu@sha256:...,
    to train with instead of building one; the run checks that its registry (or, with no registry host
    in the name, the local engine) holds it before the pool starts."""

    @field_validator("use")
    @classmethod
    def _use(cls, value: str | None) -> str | None:
        if value is not None:
            parse_reference(value)
        return value

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str | None) -> str | None:
        if value is not None and not REGISTRY.match(value):
            raise ValueError(f"{value!r} is not a registry host[:port] such as myregistry.azurecr.io or localhost:5000")
        return value

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str | None) -> str | None:
        if value is not None and not REPOSITORY.match(value):
            raise ValueError(
                f"{value!r} is not a valid image repository: use lowercase letters, digits and "
                "separators (. _ -) between them, and / between path parts, e.g. team/trainflow-cpu"
            )
        return value

    def dockerfile(self, stack: str = "") -> str:
        """The Dockerfile's name in containers/ for a framework's image stack ("" PyTorch, "tf-" TensorFlow)."""
        return f"{stack}{self.flavour}.Dockerfile"

    def image_name(self, stack: str = "") -> str:
        """registry/repository, or just the repository when nothing is pushed; `stack` as in dockerfile()."""
        repository = self.repository or f"trainflow-{stack}{self.flavour}"
        return f"{self.registry}/{repository}" if self.registry else repository


def parse_reference(reference: str) -> tuple[str | None, str, str | None, str | None]:
    """(registry host or None, name, tag, digest) of an image reference; ValueError when it is not one."""
    match = REFERENCE.match(reference)
    first, _, rest = (match["name"] if match else "").partition("/")
    host = first if rest and ("." in first or ":" in first or first == "localhost") else None
    path = rest if host else (match["name"] if match else "")
    if not match or not REPOSITORY.match(path) or (host and not REGISTRY.match(host)):
        raise ValueError(
            f"{reference!r} is not an image reference such as myregistry.azurecr.io/trainflow-gpu:v3 "
            "or localhost:5000/trainflow-cpu@sha256:<64 hex digits>"
        )
    return host, match["name"], match["tag"], match["digest"]


@dataclass(frozen=True)
class ImageRef:
    """A built image: name:tag, and the registry digest once pushed (what later steps should use)."""

    name: str
    tag: str
    digest: str | None = None

    @property
    def reference(self) -> str:
        """name@digest when pushed (immutable), else name:tag."""
        return f"{self.name}@{self.digest}" if self.digest else f"{self.name}:{self.tag}"

    @property
    def tagged(self) -> str:
        return f"{self.name}:{self.tag}"


class DockerEngine:
    """A Docker engine, reached once and checked."""

    def __init__(self, url: str | None = None, timeout: int = 600):
        where = url or "DOCKER_HOST or the local socket"
        try:
            self.client = (
                docker.DockerClient(base_url=url, timeout=timeout) if url else docker.from_env(timeout=timeout)
            )
            self.client.ping()
        except DockerException as exc:
            raise ImageError(
                f"no Docker engine reachable at {where} ({first_line(exc)}); start Docker "
                "(dockerd or Docker Desktop) or set image.engine / DOCKER_HOST to a running engine",
                permanent=True,
            ) from None
        self.api = self.client.api

    def has_image(self, ref: str) -> bool:
        """Whether the engine holds `ref` locally."""
        try:
            self.client.images.get(ref)
            return True
        except ImageNotFound:
            return False

    def build(
        self, context: Path, tag: str, build_args: dict[str, str], network: str | None, log: Log, nocache: bool = False
    ) -> str:
        """Build `context`/Dockerfile as `tag`, streaming its output to `log`; returns the image id."""
        steps = BuildSteps()
        try:
            stream = self.api.build(
                path=str(context),
                tag=tag,
                buildargs=build_args,
                network_mode=network,
                rm=True,
                forcerm=True,
                pull=False,
                nocache=nocache,
                decode=True,
            )
            for event in stream:
                if "error" in event:
                    raise ImageError(steps.failure(tag, event["error"]), permanent=True)
                for line in ANSI.sub("", event.get("stream", "")).splitlines():
                    if line.strip():
                        steps.add(line)
                        log(line)
        except APIError as exc:
            raise ImageError(f"building {tag} failed: {api_message(exc)}", permanent=exc.is_client_error()) from None
        return image_id(self.client.images.get(tag))

    def login(self, registry: str, username: str, password: str | None) -> None:
        """Check the credentials against the registry (before any upload)."""
        try:
            self.client.login(username=username, password=password, registry=registry, reauth=True)
        except APIError as exc:
            raise registry_error(registry, api_message(exc), username) from None

    def registry_digest(self, reference: str, auth: dict | None) -> str | None:
        """The digest of `reference` (name:tag or name@digest) in its registry, or None if the registry lacks it."""
        try:
            return self.api.inspect_distribution(reference, auth_config=auth)["Descriptor"]["digest"]
        except NotFound:
            return None
        except APIError as exc:
            message = api_message(exc)
            if "manifest unknown" in message or "not found" in message.lower():
                return None
            raise registry_error(reference, message, (auth or {}).get("username")) from None

    def push(self, ref: ImageRef, auth: dict | None, log: Log, advance: Callable[[int, int], None]) -> str:
        """Push name:tag; returns the registry's digest. `advance(bytes, layers)` is told of progress as it goes."""
        layers = LayerProgress(advance)
        try:
            for event in self.api.push(ref.name, tag=ref.tag, auth_config=auth, stream=True, decode=True):
                if "error" in event:
                    raise registry_error(ref.name, event["error"], (auth or {}).get("username"))
                if "aux" in event and "Digest" in event["aux"]:
                    return event["aux"]["Digest"]
                if layers.update(event):
                    log(f"{event.get('id', '')}: {event['status']}")
        except APIError as exc:
            raise registry_error(ref.name, api_message(exc), (auth or {}).get("username")) from None
        raise ImageError(f"the registry accepted {ref.tagged} but reported no digest", permanent=False)

    def pull(self, reference: str, auth: dict | None) -> str:
        """Pull `reference` (name@digest or name:tag); returns the local image id."""
        try:
            for event in self.api.pull(reference, auth_config=auth, stream=True, decode=True):
                if "error" in event:
                    raise registry_error(reference, event["error"], (auth or {}).get("username"))
            return image_id(self.client.images.get(reference))
        except APIError as exc:
            raise registry_error(reference, api_message(exc), (auth or {}).get("username")) from None


def image_id(image: Image) -> str:
    """A local image's id (docker-py's Model.id is None only for an object the engine has not described)."""
    assert image.id is not None  # images.get() returns the engine's description, which has its Id
    return image.id


class BuildSteps:
    """The build's output, grouped by Dockerfile step, to show the failing step with its own output."""

    def __init__(self):
        self.step, self.lines = "before the first step", []

    def add(self, line: str) -> None:
        if line.startswith("Step ") and " : " in line:
            self.step, self.lines = line, []
        else:
            self.lines.append(line)

    def failure(self, tag: str, error: str, keep: int = 25) -> str:
        output = "\n".join(f"    {line}" for line in self.lines[-keep:]) or "    (no output)"
        return f"building {tag} failed at {self.step}\n{output}\n  {error.strip()}"


class LayerProgress:
    """Bytes pushed so far, per layer, and layers done, from the engine's progress events."""

    def __init__(self, advance: Callable[[int, int], None]):
        self.advance = advance
        self.sent: dict[str, int] = {}  # layer id -> bytes pushed

    def update(self, event: dict) -> bool:
        """Count the event's progress; True if the event is a layer finishing (worth a log line)."""
        layer, detail, status = event.get("id"), event.get("progressDetail") or {}, event.get("status", "")
        if layer and "current" in detail:
            self.advance(max(0, detail["current"] - self.sent.get(layer, 0)), 0)
            self.sent[layer] = detail["current"]
        done = bool(layer) and status in ("Pushed", "Layer already exists") or status.startswith("Mounted from")
        if done:
            self.advance(0, 1)
        return done


HTTP_401 = re.compile(r"(?<![\d:.])401(?![\d.])")  # the status code, not a port (localhost:42401) or an address


def registry_error(where: str, message: str, username: str | None) -> ImageError:
    """A registry failure with what to do about it: credentials refused, unreachable, or a bad name."""
    lowered = message.lower()
    if any(
        s in lowered for s in ("unauthorized", "authentication required", "no basic auth", "denied")
    ) or HTTP_401.search(lowered):
        who = f"user {username!r}" if username else "anonymous access (no image.username set)"
        return ImageError(
            f"registry {where} refused {who}: {message.strip()}; check image.username and the password "
            "(image.password_env or image.password_secret)",
            permanent=True,
        )
    if any(
        s in lowered
        for s in (
            "connection refused",
            "no such host",
            "dial tcp",
            "i/o timeout",
            "timeout",
            "connection reset",
            "server gave http response",
            "eof",
        )
    ):
        return ImageError(f"registry {where} is unreachable: {message.strip()}; check image.registry and the network")
    if "invalid reference" in lowered or "repository name must" in lowered:
        return ImageError(f"invalid image name {where}: {message.strip()}", permanent=True)
    return ImageError(f"registry {where}: {message.strip()}")


def api_message(exc: APIError) -> str:
    """The engine's own explanation of an API error."""
    return str(exc.explanation or exc)


def auth_config(username: str | None, password: str | None) -> dict | None:
    """docker-py's auth_config for a push or pull, or None for anonymous access."""
    return {"username": username, "password": password} if username else None


def push_totals(engine: DockerEngine, ref: str) -> tuple[int, int]:
    """The image's bytes and its number of layers, empty ones too (each is pushed): the push progress bar's totals."""
    layers = engine.api.inspect_image(ref)["RootFS"]["Layers"]
    return sum(entry.get("Size", 0) for entry in engine.api.history(ref)), len(layers)


def registry_password(cfg: ImageConfig) -> str | None:
    """The registry password: from cfg.password_env, else the Prefect Secret block cfg.password_secret."""
    if not cfg.username:
        return None
    if os.environ.get(cfg.password_env):
        return os.environ[cfg.password_env]
    if cfg.password_secret:
        return secret_value(cfg.password_secret)
    raise ImageError(
        f"image.username is {cfg.username!r} but there is no password: set the environment variable "
        f"{cfg.password_env} or name a Prefect Secret block in image.password_secret",
        permanent=True,
    )


def secret_value(name: str) -> str:
    """The value of the Prefect Secret block `name`."""
    from prefect.blocks.system import Secret

    try:
        # prefect's async_dispatch types load() as the block or a coroutine; called from sync code it is the block
        return cast(Secret, Secret.load(name)).get()
    except ValueError:
        raise ImageError(
            f"there is no Prefect Secret block named {name!r} (image.password_secret); create it in the "
            "UI (Blocks > Secret) or with Secret(value=...).save(name)",
            permanent=True,
        ) from None
