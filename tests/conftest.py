"""Shared fixtures: the small digits data set, hand-made image trees, and the real local services (Azurite, Prefect's
test server, a Docker engine, a registry with authentication, the CPU training images of PyTorch and TensorFlow); and
how the suite shares its tests among pytest-xdist's workers (tests/fakes/xdist_groups.py)."""

import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest
import torchvision  # noqa: F401 - before anything imports TensorFlow: importing torchvision after it crashes the process

from infra.data.sample_data import write_digits
from infra.images.build_context import wheel_cache
from infra.images.local_docker import collect_registry_garbage, running_engine, running_registry
from infra.images.registry import DockerEngine
from infra.services.azurite import running_azurite
from tests.fakes.image_files import write_image
from tests.fakes.registry import Registry, image_config, kept_storage, registry_cache
from tests.fakes.xdist_groups import Groups

# Under pytest-xdist (`make test` runs 2 workers), the tests of a group run on one worker, the groups first, being
# the longest; the workers take the rest a test at a time. Every test that uses the Docker engine is in the group
# docker: one dockerd, one registry, one build of the image, and the checks that no container is left see only
# their own. A module whose tests share one costly module fixture (the loaders' trainings, the bad inputs' 40
# command lines) marks itself `xdist_group` and is a group of its own, so that its fixture runs once, not once per
# worker. The workers see only node ids, so the groups are named by module here; collection stops, naming the
# module, if a test that needs a group is in a module outside it.
DOCKER_FIXTURES = ("docker_engine", "registry", "cpu_image", "tf_cpu_image")
IMAGES = ("cpu_image", "tf_cpu_image")  # the fixtures that build a training image
GROUPS = {
    "tests/integration/infra/images/test_images.py": "docker",
    "tests/integration/flows/test_train_flow_docker.py": "docker",
    "tests/integration/trainer/test_loaders.py": "loaders",
    "tests/integration/flows/test_bad_inputs.py": "bad-inputs",
    "tests/integration/trainer/test_tf_training.py": "tf-training",
    "tests/integration/trainer/test_init_from.py": "init-from",
    "tests/integration/cli/test_predict.py": "predict",
}


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Groups(GROUPS, dict.fromkeys(DOCKER_FIXTURES, "docker")), "trainflow-groups")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: `-m "not slow"` must see the mark
def pytest_collection_modifyitems(config, items) -> None:
    """Every test that uses a CPU image is `slow`: the session's first user builds it (PyTorch's about 6 GB, ~15 min
    cold; TensorFlow's about 2 GB, ~10 min), so `-m "not slow"` must leave them all out, however a test gets at it."""
    for item in items:
        if set(IMAGES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


SUITE_TMP_GIB = 6  # a full run's peak under the temp folder: 5.7 GiB measured (du, every 30 s) on 2026-11-27


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse, in one line, a session whose temp folder has less free than the suite writes there: out of space,
    tests fail in confusing places. TRAINFLOW_TEST_FREE_GIB sets the figure (0 skips the check)."""
    need = float(os.environ.get("TRAINFLOW_TEST_FREE_GIB", SUITE_TMP_GIB))
    folder = tempfile.gettempdir()
    free = shutil.disk_usage(folder).free / 2**30
    if free < need:
        pytest.exit(
            f"error: {folder} has {free:.1f} GiB free and the test suite writes up to {need:g} GiB there; free space "
            "or point TMPDIR at a bigger disk (TRAINFLOW_TEST_FREE_GIB=N for a smaller selection)",
            returncode=1,
        )


def pytest_report_header(config) -> str:
    """Free disk where the tests write: a run out of space fails in confusing places, so say it up front."""
    folder = tempfile.gettempdir()
    return (
        f"free disk: {shutil.disk_usage(folder).free / 2**30:.0f} GiB in {folder} (a full run writes up to about 6 GiB "
        "there, removed when it passes, and Docker keeps about 7 GiB of images in its data root)"
    )


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> Path:
    """scikit-learn's digits as 32x32 PNGs in ImageNet layout, written once per test session."""
    return write_digits(tmp_path_factory.mktemp("data") / "digits")


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


@pytest.fixture(scope="module")
def prefect_server():
    """Prefect's test server (a temporary database) for the module's flow runs."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory) -> DockerEngine:
    """The Docker engine: the running one, else dockerd started for the session (as NOTES describes)."""
    with running_engine(tmp_path_factory.mktemp("dockerd")):
        yield DockerEngine()


@pytest.fixture(scope="session")
def registry(tmp_path_factory) -> Registry:
    """A Distribution registry with htpasswd authentication, for the session.

    It starts with no image in it, so the session's image is pushed, but its storage (registry_cache()) is kept: the
    layers an earlier session pushed are there, and the engine does not send them again (a rebuilt image's last
    layers are what a push costs). At the end everything this session did not push is garbage-collected, so the
    cache holds one image. A second test session at the same time gets empty storage of its own."""
    username, password = "trainflow-ci", secrets.token_urlsafe(16)
    data_dir = tmp_path_factory.mktemp("registry")
    collect = lambda: collect_registry_garbage(data_dir)  # noqa: E731 - read where it is used
    with (
        kept_storage(registry_cache(), data_dir / "storage", collect) as storage,
        running_registry(data_dir, username, password, storage=storage) as host,
    ):
        yield Registry(host, username, password)


@pytest.fixture(scope="session")
def cpu_image(docker_engine, registry, tmp_path_factory) -> dict:
    """The CPU training image, built (or found in the engine) and pushed to the session's registry."""
    from tasks.build_image import build_and_push

    context = tmp_path_factory.mktemp("context") / "cpu"
    return build_and_push(docker_engine, image_config(registry), context, wheel_cache(), registry.password, print)


@pytest.fixture(scope="session")
def tf_cpu_image(docker_engine, registry, tmp_path_factory) -> dict:
    """The TensorFlow CPU training image (containers/tf-cpu.Dockerfile: TensorFlow, tf_keras, Horovod, no torch), built
    (or found in the engine) and pushed to the session's registry, as `trainflow build` does for training.framework
    tensorflow or keras."""
    from tasks.build_image import build_and_push

    context = tmp_path_factory.mktemp("context") / "tf-cpu"
    cfg, password = image_config(registry), registry.password
    return build_and_push(docker_engine, cfg, context, wheel_cache(), password, print, stack="tf-")
