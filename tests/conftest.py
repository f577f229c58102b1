"""Shared fixtures: the small digits data set, hand-made image trees, and the real local services
(Azurite, a Docker engine, a registry with authentication, the CPU training image)."""

import fcntl
import os
import secrets
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from infra.compute.process import train_here
from infra.data.sample_data import write_digits
from infra.images.build_context import wheel_cache
from infra.images.local_docker import collect_registry_garbage, running_engine, running_registry
from infra.images.registry import DockerEngine, ImageConfig
from infra.services.azurite import running_azurite

DOCKER_FIXTURES = {"docker_engine", "registry", "cpu_image"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items) -> None:
    """Every test that uses the CPU image is `slow`: the session's first user builds it (about 6 GB, ~15 min cold),
    so `-m "not slow"` must leave them all out, however a test gets at the image.

    Under pytest-xdist (`make test` runs 2 workers, `--dist loadgroup`), every test that uses the Docker engine is in
    one group, so one worker runs them all: one dockerd, one registry, one build of the image, and the checks that
    no container is left see only their own. A module whose tests share one costly module fixture (the loaders'
    trainings, the bad inputs' 40 command lines) marks itself `xdist_group` too, so that its fixture runs once, not
    once per worker. The groups go first, being the longest; the workers take the rest a test at a time."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "cpu_image" in fixtures:
            item.add_marker(pytest.mark.slow)
        if fixtures & DOCKER_FIXTURES:
            item.add_marker(pytest.mark.xdist_group("docker"))
        group = item.get_closest_marker("xdist_group")
        if group and getattr(config.option, "loadgroup", False):  # in an xdist worker, --dist loadgroup
            in_group(item, group.args[0])
    items.sort(key=lambda item: not item.get_closest_marker("xdist_group"))  # stable: the group first, in order


def in_group(item: pytest.Item, group: str) -> None:
    """What pytest-xdist 3.8's worker does for an xdist_group mark: `@group` after the test's id, which its loadgroup
    scheduler reads. It writes `item._nodeid`, which pytest 9.2 no longer reads (the id is `item._id`, a NodeId), so
    its groups are silently ignored there; this writes the id pytest 9.2 reads."""
    from _pytest.nodeid import NodeId

    if not item.nodeid.endswith(f"@{group}"):
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


def pytest_report_header(config) -> str:
    """Free disk where the tests write: a run out of space fails in confusing places, so say it up front."""
    folder = tempfile.gettempdir()
    return (
        f"free disk: {shutil.disk_usage(folder).free / 2**30:.0f} GiB in {folder} (a full run writes about 5 GiB "
        "there, removed when it passes, and Docker keeps about 7 GiB of images in its data root)"
    )


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> Path:
    """scikit-learn's digits as 32x32 PNGs in ImageNet layout, written once per test session."""
    return write_digits(tmp_path_factory.mktemp("data") / "digits")


def write_image(path: Path, mode: str = "RGB", size: int = 12, fmt: str | None = None) -> Path:
    """A small random image in the given PIL mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(path)))
    channels = {"L": 1, "RGB": 3, "RGBA": 4, "CMYK": 4}[mode if mode != "P" else "L"]
    pixels = rng.integers(0, 255, (size, size, channels), dtype=np.uint8).squeeze()
    image = Image.fromarray(pixels, mode="L" if mode == "P" else mode)
    if mode == "P":
        image = image.convert("P")
        image.info["transparency"] = 0
    image.save(path, format=fmt)
    return path


def write_png_header(path, width: int, height: int):
    """A PNG that declares width x height pixels and holds none: PIL's decompression-bomb check reads only this."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IEND", b"")
    )
    return path


@pytest.fixture
def image_tree(tmp_path) -> Path:
    """A two-class train/val tree with the awkward cases real data sets hold."""
    root = tmp_path / "mixed data"
    write_image(root / "train" / "cat" / "gray.png", "L")
    write_image(root / "train" / "cat" / "cmyk.jpg", "CMYK", fmt="JPEG")
    write_image(root / "train" / "cat" / "nested" / "deeper" / "rgba.png", "RGBA")
    write_image(root / "train" / "chat noir é" / "palette transparent.png", "P")
    write_image(root / "train" / "chat noir é" / "日本語 名前.png", "RGB")
    write_image(root / "train" / "chat noir é" / "plain.JPEG", "RGB", fmt="JPEG")
    write_image(root / "val" / "cat" / "v1.png", "RGB")
    write_image(root / "val" / "chat noir é" / "v2.png", "L")
    (root / "train" / "cat" / ".DS_Store").write_bytes(b"\0\1")
    return root


@pytest.fixture(scope="session")
def azurite_port(tmp_path_factory) -> int:
    """A real Azurite for the whole test session, started the way trainflow starts it."""
    with running_azurite(tmp_path_factory.mktemp("azurite")) as port:
        yield port


@dataclass(frozen=True)
class Registry:
    host: str
    username: str
    password: str


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory) -> DockerEngine:
    """The Docker engine: the running one, else dockerd started for the session (as NOTES describes)."""
    with running_engine(tmp_path_factory.mktemp("dockerd")):
        yield DockerEngine()


def registry_cache() -> Path:
    """The test registry's storage, kept between sessions as a team's registry is (the pushed image is gigabytes):
    TRAINFLOW_TEST_REGISTRY, else ~/.cache/trainflow/test-registry."""
    return Path(os.environ.get("TRAINFLOW_TEST_REGISTRY", Path.home() / ".cache" / "trainflow" / "test-registry"))


@pytest.fixture(scope="session")
def registry(tmp_path_factory) -> Registry:
    """A Distribution registry with htpasswd authentication, for the session.

    It starts with no image in it, so the session's image is pushed, but its storage (registry_cache()) is kept: the
    layers an earlier session pushed are there, and the engine does not send them again (a rebuilt image's last
    layers are what a push costs). At the end everything this session did not push is garbage-collected, so the
    cache holds one image. A second test session at the same time gets empty storage of its own."""
    username, password = "trainflow-ci", secrets.token_urlsafe(16)
    data_dir = tmp_path_factory.mktemp("registry")
    with kept_storage(registry_cache(), data_dir / "storage", lambda: collect_registry_garbage(data_dir)) as storage:
        with running_registry(data_dir, username, password, storage=storage) as host:
            yield Registry(host, username, password)


@contextmanager
def kept_storage(cache: Path, fallback: Path, collect: Callable[[], None]) -> Iterator[Path]:
    """The registry storage `cache` with no tags in it, held for the block, then `collect`ed if the block pushed
    anything (the registry stopped; the cache removed if that fails); `fallback` (removed after) when another session
    holds it."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / f"{cache.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                yield fallback
            finally:  # the pushed test image is gigabytes: never left behind, whatever the outcome
                shutil.rmtree(fallback, ignore_errors=True)
            return
        # a repository's tags are folders in its _manifests/tags (distribution's registry/storage/paths.go:
        # manifestTagsPathSpec); without them every manifest is untagged, and the session's first build pushes. The
        # tags folder itself stays: garbage-collect fails on a repository without one ("failed to retrieve tags").
        for tag in cache.glob("docker/registry/v2/repositories/**/_manifests/tags/*"):
            shutil.rmtree(tag)
        yield cache
        if not any(cache.glob("docker/registry/v2/repositories/**/_manifests/tags/*")):
            return  # the session pushed nothing (a part of the suite): what an earlier one pushed stays
        try:
            collect()
        except subprocess.CalledProcessError as exc:  # a cache, not a result: the next session pushes whole
            print(f"registry cache {cache} removed: garbage-collect failed ({exc.stderr.strip()[-300:]})")
            shutil.rmtree(cache, ignore_errors=True)


def image_config(service: Registry, **overrides) -> ImageConfig:
    """The CPU image on the local base, pushed to the session's registry."""
    values = {
        "flavour": "cpu",
        "registry": service.host,
        "base_image": "local",
        "build_network": "host",
        "username": service.username,
        **overrides,
    }
    return ImageConfig(**values)


@pytest.fixture(scope="session")
def cpu_image(docker_engine, registry, tmp_path_factory) -> dict:
    """The CPU training image, built (or found in the engine) and pushed to the session's registry."""
    from tasks.build_image import build_and_push

    context = tmp_path_factory.mktemp("context") / "cpu"
    return build_and_push(docker_engine, image_config(registry), context, wheel_cache(), registry.password, print)


def train_locally(training, data: str, out: Path, echo) -> dict:
    """`training` on this machine's process pool, as `trainflow train` runs it; the run's metrics.json."""
    return train_here(training, data, out, out.parent / "pools", echo).model_dump()
