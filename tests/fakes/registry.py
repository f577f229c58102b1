"""The test sessions' image registry: its credentials, the storage kept between sessions, the CPU image's settings
for it. The fixtures that start it (docker_engine, registry, cpu_image) are in tests/conftest.py."""

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from infra.images.registry import ImageConfig


@dataclass(frozen=True)
class Registry:
    host: str
    username: str
    password: str


def registry_cache() -> Path:
    """The test registry's storage, kept between sessions as a team's registry is (the pushed image is gigabytes):
    TRAINFLOW_TEST_REGISTRY, else ~/.cache/trainflow/test-registry."""
    return Path(os.environ.get("TRAINFLOW_TEST_REGISTRY", Path.home() / ".cache" / "trainflow" / "test-registry"))


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
