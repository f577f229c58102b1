"""Image names, content tags, the Dockerfiles as files, and how registry failures are described."""

import hashlib
import os
import re
import subprocess
import sys
import tomllib

import dockerfile
import pytest
import torch
from pydantic import ValidationError

from infra.images.build_context import CONTAINERS, context_tag, source_files
from infra.images.registry import (
    BuildSteps,
    ImageConfig,
    ImageError,
    ImageRef,
    LayerProgress,
    registry_error,
    registry_password,
)
from tasks.build_image import build_args
from tests.fakes.paths import REPO


def pyproject_pins() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(d.split("==") for d in deps if "==" in d)


def requirement_pins(name: str) -> dict[str, str]:
    lines = (CONTAINERS / "requirements" / name).read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def instructions(flavour: str) -> list:
    return dockerfile.parse_file(str(CONTAINERS / f"{flavour}.Dockerfile"))


@pytest.mark.parametrize("flavour", ["cpu", "gpu"])
def test_dockerfiles_parse_and_install_the_pinned_requirements(flavour):
    commands = instructions(flavour)
    assert commands[0].cmd == "ARG" and commands[1].cmd == "FROM"
    runs = " ".join(c.value[0] for c in commands if c.cmd == "RUN")
    assert "requirements/torch.txt" in runs and "requirements/image.txt" in runs
    assert "horovod-wheel.sh" in runs and "horovodrun --check-build" in runs
    copies = [c.value for c in commands if c.cmd == "COPY"]
    assert ("trainer/", "/opt/trainflow/trainer/") in copies  # the one training package, in both images
    # horovod-wheel.sh applies the patch beside it with `patch`, installed in the stage that compiles Horovod
    assert ("build/", "/tmp/build/") in copies and "/tmp/build/horovod-wheel.sh" in runs
    compiling = next(c.value[0] for c in commands if c.cmd == "RUN" and " g++ " in c.value[0])
    assert " patch " in compiling


def test_gpu_base_is_pinned_by_version_tag():
    base = instructions("gpu")[0].value[0].split("=", 1)[1]
    name, tag = base.rsplit(":", 1)
    assert name == "nvidia/cuda" and re.match(r"^\d+\.\d+\.\d+-cudnn-devel-ubuntu\d+\.\d+$", tag), base


def test_gpu_image_builds_horovod_with_nccl_mpi_and_gloo():
    runs = " ".join(c.value[0] for c in instructions("gpu") if c.cmd == "RUN")
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in runs and "HOROVOD_WITH_MPI=1" in runs and "openmpi-bin" in runs
    assert "HOROVOD_WITH_GLOO=1" in (CONTAINERS / "build" / "horovod-wheel.sh").read_text()
    env = [c.value for c in instructions("gpu") if c.cmd == "ENV"][-1]
    assert "NCCL_DEBUG" in env and "NCCL_SOCKET_IFNAME" in env


def test_images_install_the_project_pins():
    pins = pyproject_pins()
    assert requirement_pins("torch.txt") == {"torch": pins["torch"], "torchvision": pins["torchvision"]}
    image = requirement_pins("image.txt")
    assert image["mlflow-skinny"] == pins["mlflow-skinny"]  # the engine's tracking (--tracking-uri)
    for name in ("psutil", "PyYAML", "cloudpickle"):
        if name in pins:
            assert image[name] == pins[name], name
    script = (CONTAINERS / "build" / "horovod-wheel.sh").read_text()
    assert f"VERSION={pins['horovod']}" in script


def test_the_horovod_wheel_cache_is_keyed_by_the_patch(tmp_path):
    """A wheel built before the patch changed is not reused: horovod-wheel.sh takes only the one under its patch's
    hash (it prints a cached wheel without building)."""
    build = CONTAINERS / "build"
    digest = hashlib.sha256((build / "horovod-idle-cycle.patch").read_bytes()).hexdigest()[:12]
    stem = f"horovod-0.28.1-torch-{torch.__version__.split('+')[0]}-cpu"
    for folder in (stem, f"{stem}-{digest}"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "HOROVOD_GPU_OPERATIONS"}
    printed = subprocess.run(
        [str(build / "horovod-wheel.sh"), sys.executable, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()
    assert printed == str(tmp_path / f"{stem}-{digest}" / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl")


def test_the_setup_lock_holds_every_project_pin_at_its_version():
    """make setup installs with pip -c constraints.txt: a pin the lock contradicts would make pip refuse."""
    lock = {name.lower(): version for name, version in requirement_pins("constraints.txt").items()}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = pyproject_pins() | dict(d.split("==") for d in project["optional-dependencies"]["dev"])
    assert {name.lower(): version for name, version in pins.items()}.items() <= lock.items()
    assert "-c $(LOCK)" in (REPO / "Makefile").read_text()


def test_make_setup_runs_its_four_parts_at_once():
    """README: make setup installs the venv, node_modules, Debian's tools and the tools' venv at once (make -j4)."""
    outer = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under make test
    plan = subprocess.run(["make", "-n", "setup"], cwd=REPO, capture_output=True, text=True, check=True, env=outer)
    sub_make = [line.split() for line in plan.stdout.splitlines() if "-j4" in line.split()]
    assert [words[-4:] for words in sub_make] == [
        [".venv/.installed", "node_modules/.installed", "docker-setup", "tools"]
    ], plan.stdout


def test_context_tag_follows_content_paths_and_build_args(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.py").write_text("x = 1\n")
    first = context_tag(tmp_path, {"BASE_IMAGE": "b:1"})
    assert context_tag(tmp_path, {"BASE_IMAGE": "b:1"}) == first
    assert context_tag(tmp_path, {"BASE_IMAGE": "b:2"}) != first
    (tmp_path / "a" / "f.py").write_text("x = 2\n")
    changed = context_tag(tmp_path, {"BASE_IMAGE": "b:1"})
    (tmp_path / "a" / "f.py").rename(tmp_path / "a" / "g.py")
    assert len({first, changed, context_tag(tmp_path, {"BASE_IMAGE": "b:1"})}) == 3
    assert len(first) == 20 and first.isalnum()


def test_context_holds_one_training_package_and_no_caches():
    files = source_files("cpu")
    assert files["Dockerfile"].name == "cpu.Dockerfile"
    assert "trainer/train.py" in files and "build/horovod-wheel.sh" in files
    assert "build/horovod-idle-cycle.patch" in files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]


@pytest.mark.parametrize(
    "field, value",
    [
        ("repository", "Trainflow"),
        ("repository", "team//x"),
        ("repository", "-x"),
        ("repository", "a b"),
        ("registry", "http://myacr.azurecr.io"),
        ("registry", "my_registry:5000"),
        ("registry", "host:port"),
    ],
)
def test_invalid_image_names_are_refused_by_name(field, value):
    with pytest.raises(ValidationError, match=field):
        ImageConfig(**{field: value})


def test_image_names_and_references():
    assert ImageConfig().image_name() == "trainflow-cpu"
    cfg = ImageConfig(flavour="gpu", registry="myacr.azurecr.io", repository="team/train-er_1")
    assert cfg.image_name() == "myacr.azurecr.io/team/train-er_1"
    assert ImageConfig(registry="localhost:5000").image_name() == "localhost:5000/trainflow-cpu"
    ref = ImageRef("localhost:5000/x", "abc")
    assert ref.reference == "localhost:5000/x:abc"
    assert ImageRef("localhost:5000/x", "abc", "sha256:00").reference == "localhost:5000/x@sha256:00"


def test_build_failure_names_the_step_and_shows_its_output():
    steps = BuildSteps()
    for line in ["Step 1/2 : FROM x", " ---> 123", "Step 2/2 : RUN make", "cc: error: no input files"]:
        steps.add(line)
    message = steps.failure("img:1", "The command '/bin/sh -c make' returned a non-zero code: 2")
    assert "failed at Step 2/2 : RUN make" in message and "cc: error: no input files" in message
    assert "---> 123" not in message


def test_registry_errors_say_what_to_fix():
    refused = registry_error("localhost:5000/x", "unauthorized: authentication required", "bob")
    assert refused.permanent and "refused user 'bob'" in refused.args[0] and "password" in refused.args[0]
    anonymous = registry_error("r/x", "no basic auth credentials", None)
    assert anonymous.permanent and "anonymous" in anonymous.args[0]
    down = registry_error(
        "localhost:1/x", "Get http://localhost:1/v2/: dial tcp 127.0.0.1:1: connect: connection refused", "bob"
    )
    assert not down.permanent and "unreachable" in down.args[0]
    # a port with 401 in it is not the status code 401 (a CI run's random port 42401 read as refused credentials)
    port = registry_error(
        "localhost:42401",
        'Get "http://localhost:42401/v2/": dial tcp 127.0.0.1:42401: connect: connection refused',
        "bob",
    )
    assert not port.permanent and "unreachable" in port.args[0]
    status = registry_error("r/x", "received unexpected HTTP status: 401 Unauthorized", "bob")
    assert status.permanent and "refused user 'bob'" in status.args[0]
    assert registry_error("r/x", "error: 401", "bob").permanent


def test_push_progress_counts_bytes_per_layer():
    seen = []
    layers = LayerProgress(lambda n, done: seen.append((n, done)))
    assert not layers.update({"id": "a", "status": "Pushing", "progressDetail": {"current": 10, "total": 30}})
    layers.update({"id": "a", "status": "Pushing", "progressDetail": {"current": 30, "total": 30}})
    layers.update({"id": "b", "status": "Pushing", "progressDetail": {"current": 5, "total": 5}})
    assert layers.update({"id": "a", "status": "Pushed", "progressDetail": {}})
    assert sum(n for n, _ in seen) == 35 and sum(done for _, done in seen) == 1


def test_password_comes_from_the_environment_or_is_asked_for(monkeypatch):
    cfg = ImageConfig(registry="localhost:5000", username="bob", password_env="TF_TEST_PW")
    monkeypatch.setenv("TF_TEST_PW", "s3cret")
    assert registry_password(cfg) == "s3cret"
    monkeypatch.delenv("TF_TEST_PW")
    with pytest.raises(ImageError, match="TF_TEST_PW") as failure:
        registry_password(cfg)
    assert failure.value.permanent
    assert registry_password(ImageConfig(registry="localhost:5000")) is None


def test_build_args_replace_the_base_only_when_asked():
    assert build_args(ImageConfig(build_args={"X": "1"}), None) == {"X": "1"}
    assert build_args(ImageConfig(), "base:1") == {"BASE_IMAGE": "base:1"}


def test_only_the_gpu_image_installs_dali_at_the_project_s_pin():
    """--loader dali: pyproject's `dali` extra (and dev's, for the tests) pin the one version the GPU image installs."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pin = dict(d.split("==") for d in extras["dali"])
    assert requirement_pins("dali.txt") == pin and pin.items() <= dict(d.split("==") for d in extras["dev"]).items()
    runs = {
        flavour: " ".join(c.value[0] for c in instructions(flavour) if c.cmd == "RUN") for flavour in ("cpu", "gpu")
    }
    assert "requirements/dali.txt" in runs["gpu"] and "dali" not in runs["cpu"]
