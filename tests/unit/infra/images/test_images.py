"""Image names, content tags, the Dockerfiles as files (PyTorch's and TensorFlow's), the pins they install, and how
registry failures are described."""

import hashlib
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata

import dockerfile
import pytest
import torch
from pydantic import ValidationError

from infra.images import build_context
from infra.images.build_context import CONTAINERS, assemble_context, context_tag, source_files
from infra.images.registry import (
    BuildSteps,
    ImageConfig,
    ImageError,
    ImageRef,
    LayerProgress,
    registry_error,
    registry_password,
)
from tasks.build_image import build_args, image_ref
from tests.fakes.paths import REPO

TORCH_IMAGES, TF_IMAGES = ("cpu", "gpu"), ("tf-cpu", "tf-gpu")


def pyproject_pins() -> dict[str, str]:
    """The project's pins: its dependencies and its layers' extras (TensorFlow, Horovod)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    deps = project["dependencies"] + extras["tensorflow"] + extras["horovod"]
    return dict(d.split("==") for d in deps if "==" in d)


def requirement_pins(name: str) -> dict[str, str]:
    lines = (CONTAINERS / "requirements" / name).read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def normalised(pins: dict[str, str]) -> dict[str, str]:
    """Names as pip compares them (PEP 503): ml_dtypes and ml-dtypes are one package."""
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins.items()}


def instructions(name: str) -> list:
    return dockerfile.parse_file(str(CONTAINERS / f"{name}.Dockerfile"))


def runs_of(name: str) -> str:
    return " ".join(c.value[0] for c in instructions(name) if c.cmd == "RUN")


def env_of(name: str) -> dict[str, str]:
    values = [value for c in instructions(name) if c.cmd == "ENV" for value in c.value]
    return dict(zip(values[::2], values[1::2]))


@pytest.mark.parametrize("name", TORCH_IMAGES + TF_IMAGES)
def test_dockerfiles_parse_and_install_the_pinned_requirements(name):
    commands = instructions(name)
    assert commands[0].cmd == "ARG" and commands[1].cmd == "FROM"
    runs = runs_of(name)
    framework = (
        ["requirements/tensorflow", "requirements/tf-keras.txt"] if name in TF_IMAGES else ["requirements/torch.txt"]
    )
    assert all(f in runs for f in framework) and "requirements/image.txt" in runs
    assert "horovod-wheel.sh" in runs and "horovodrun --check-build" in runs
    copies = [c.value for c in commands if c.cmd == "COPY"]
    assert ("trainer/", "/opt/trainflow/trainer/") in copies  # the one training package, in every image
    # horovod-wheel.sh applies the patches beside it with `patch`, installed in the stage that compiles Horovod
    assert ("build/", "/tmp/build/") in copies and "/tmp/build/horovod-wheel.sh" in runs
    compiling = next(c.value[0] for c in commands if c.cmd == "RUN" and " g++ " in c.value[0])
    assert " patch " in compiling


@pytest.mark.parametrize("name, cuda", [("gpu", "13"), ("tf-gpu", "12")])  # TensorFlow 2.21's CUDA libraries: 12
def test_gpu_base_is_pinned_by_version_tag(name, cuda):
    base = instructions(name)[0].value[0].split("=", 1)[1]
    image, tag = base.rsplit(":", 1)
    assert image == "nvidia/cuda" and re.match(rf"^{cuda}\.\d+\.\d+-cudnn-devel-ubuntu\d+\.\d+$", tag), base


@pytest.mark.parametrize("name", ["gpu", "tf-gpu"])
def test_gpu_image_builds_horovod_with_nccl_mpi_and_gloo(name):
    runs = runs_of(name)
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in runs and "HOROVOD_WITH_MPI=1" in runs and "openmpi-bin" in runs
    assert "HOROVOD_NCCL_LINK=SHARED" in runs and "import nvidia.nccl" in runs  # the NCCL of the framework's wheels
    assert "HOROVOD_WITH_GLOO=1" in (CONTAINERS / "build" / "horovod-wheel.sh").read_text()
    env = env_of(name)
    assert "NCCL_DEBUG" in env and "NCCL_SOCKET_IFNAME" in env


@pytest.mark.parametrize("name", TF_IMAGES)
def test_tensorflow_images_run_the_tf_trainers_on_tf_keras_without_torch(name):
    """One image per framework's libraries: the TensorFlow images install no torch (the TF trainers never import it),
    take tf_keras with --no-deps (its metadata asks for the full `tensorflow` wheel) and make tf.keras tf_keras."""
    commands = instructions(name)
    runs = runs_of(name)
    assert "torch" not in runs and "dali" not in runs
    assert "--no-deps -r /opt/trainflow/requirements/tf-keras.txt" in runs
    env = env_of(name)
    assert env["TF_USE_LEGACY_KERAS"] == "1" and env["TRAINFLOW_TRAINER"] == "/opt/trainflow/trainer/tf/loop.py"
    assert [c.value for c in commands if c.cmd == "CMD"][-1][:2] == ("python", "/opt/trainflow/trainer/tf/loop.py")
    label = " ".join(v for c in commands if c.cmd == "LABEL" for v in c.value)
    assert f'"trainflow-{name}"' in label and f'"containers/{name}.Dockerfile"' in label


def test_the_tensorflow_cpu_image_installs_only_from_its_context_and_keeps_its_compilers_out():
    commands = instructions("tf-cpu")
    runs = [c.value[0] for c in commands if c.cmd == "RUN" and "pip install" in c.value[0]]
    assert runs and all(run.count("pip install") == run.count("--no-index") for run in runs)
    last_stage = max(i for i, c in enumerate(commands) if c.cmd == "FROM")
    assert [c.value for c in commands[last_stage:] if c.cmd == "COPY" and c.flags] == [("/opt/venv/", "/opt/venv/")]
    assert not any(" g++ " in c.value[0] for c in commands[last_stage:] if c.cmd == "RUN")


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


def test_the_tensorflow_images_install_the_project_and_lock_pins():
    """tensorflow-cpu at pyproject's pin (the GPU image's CUDA build at the same version), and every package of
    tensorflow.txt and tf-keras.txt at the version make setup's lock installs in the venv."""
    pins, lock = pyproject_pins(), normalised(requirement_pins("constraints.txt"))
    cpu, gpu, keras = (requirement_pins(name) for name in ("tensorflow.txt", "tensorflow-gpu.txt", "tf-keras.txt"))
    assert cpu["tensorflow-cpu"] == pins["tensorflow-cpu"] == gpu["tensorflow[and-cuda]"] == keras["tf-keras"]
    assert normalised(cpu | keras).items() <= lock.items()
    assert not normalised(cpu).keys() & normalised(requirement_pins("image.txt")).keys()  # one pin per package
    assert all(name.startswith("nvidia-") and name.endswith("-cu12") for name in gpu if name != "tensorflow[and-cuda]")
    # tf-keras's metadata asks for `tensorflow` (the full wheel), which would come beside tensorflow-cpu
    assert not any(
        dep.startswith("tf-keras")
        for dep in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    )


def test_make_setup_installs_both_frameworks_before_it_builds_horovod():
    """The venv's Horovod is built against what is installed when horovod-wheel.sh runs: torch and TensorFlow."""
    outer = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under make test
    plan = subprocess.run(
        ["make", "-n", "-B", "WITH_TF=1", ".venv/.horovod"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env=outer,
    ).stdout
    build = plan.index("horovod-wheel.sh")
    assert -1 < plan.find("tensorflow-cpu==") < build and -1 < plan.find(" -e .") < build  # torch with the base
    assert -1 < plan.find("--no-deps -r containers/requirements/tf-keras.txt") < build
    stamp = subprocess.run(["make", "-pn", "setup"], cwd=REPO, capture_output=True, text=True, env=outer).stdout
    rule = next(line for line in stamp.splitlines() if line.startswith(".venv/.horovod:"))
    assert all(f"containers/build/{name}" in rule for name in ("horovod-idle-cycle.patch", "horovod-tensorflow.patch"))


def cached_wheel(cache, frameworks: str, patches: list[str]) -> str:
    """Make two cached wheels for `frameworks`, one under the hash of `patches`, one under no hash; the first's path."""
    build = CONTAINERS / "build"
    digest = hashlib.sha256(b"".join((build / name).read_bytes() for name in patches)).hexdigest()[:12]
    stem = f"horovod-0.28.1-{frameworks}-cpu"
    for folder in (stem, f"{stem}-{digest}"):
        (cache / folder).mkdir(parents=True)
        (cache / folder / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_text("")
    return str(cache / f"{stem}-{digest}" / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl")


def printed_wheel(python: str, cache) -> str:
    """What horovod-wheel.sh prints for `python` (a cached wheel is printed without building)."""
    env = {k: v for k, v in os.environ.items() if k != "HOROVOD_GPU_OPERATIONS"}
    return subprocess.run(
        [str(CONTAINERS / "build" / "horovod-wheel.sh"), python, str(cache)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()


@pytest.mark.parametrize(
    "frameworks, patches",
    [
        ("torch-2.14.1", ["horovod-idle-cycle.patch"]),  # the PyTorch images
        ("tf-2.21.0", ["horovod-idle-cycle.patch", "horovod-tensorflow.patch"]),  # the TensorFlow images
        ("torch-2.14.1-tf-2.21.0", ["horovod-idle-cycle.patch", "horovod-tensorflow.patch"]),  # the venv
    ],
)
def test_the_horovod_wheel_cache_is_keyed_by_the_frameworks_and_the_patches(tmp_path, frameworks, patches):
    """A wheel built for other frameworks, or before a patch changed, is not reused: horovod-wheel.sh takes only the one
    under the frameworks it finds and its patches' hash (the TensorFlow patch only where TensorFlow is)."""
    python = tmp_path / "python"  # answers the script's question (which frameworks are installed) as a venv would
    python.write_text(f"#!/bin/sh\ncat >/dev/null\necho {frameworks}\n")
    python.chmod(0o755)
    expected = cached_wheel(tmp_path / "cache", frameworks, patches)
    assert printed_wheel(str(python), tmp_path / "cache") == expected


def test_the_venv_s_horovod_wheel_is_keyed_by_both_of_its_frameworks(tmp_path):
    frameworks = f"torch-{torch.__version__.split('+')[0]}-tf-{metadata.version('tensorflow-cpu')}"
    expected = cached_wheel(tmp_path, frameworks, ["horovod-idle-cycle.patch", "horovod-tensorflow.patch"])
    assert printed_wheel(sys.executable, tmp_path) == expected


def test_the_setup_lock_holds_every_project_pin_at_its_version():
    """make setup installs with pip -c constraints.txt: a pin the lock contradicts would make pip refuse."""
    lock = {name.lower(): version for name, version in requirement_pins("constraints.txt").items()}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = pyproject_pins() | dict(d.split("==") for d in project["optional-dependencies"]["dev"])
    assert {name.lower(): version for name, version in pins.items()}.items() <= lock.items()
    assert "-c $(LOCK)" in (REPO / "Makefile").read_text()


def test_make_setup_runs_its_four_parts_at_once():
    """make setup installs the venv, node_modules, Debian's tools and the tools' venv at once
    (make -j4)."""
    outer = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under make test
    plan = subprocess.run(["make", "-n", "setup"], cwd=REPO, capture_output=True, text=True, check=True, env=outer)
    sub_make = [line.split() for line in plan.stdout.splitlines() if "-j4" in line.split()]
    assert [words[-4:] for words in sub_make] == [[".venv/.dev", "node_modules/.installed", "docker-setup", "tools"]], (
        plan.stdout
    )


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


@pytest.mark.parametrize("name", TORCH_IMAGES + TF_IMAGES)
def test_context_holds_one_training_package_and_no_caches(name):
    files = source_files(f"{name}.Dockerfile")
    assert files["Dockerfile"].name == f"{name}.Dockerfile"
    assert "trainer/train.py" in files and "build/horovod-wheel.sh" in files
    assert "build/horovod-idle-cycle.patch" in files and "build/horovod-tensorflow.patch" in files
    assert "requirements/tensorflow.txt" in files and "requirements/tf-keras.txt" in files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]


def test_a_dockerfile_that_is_not_there_is_a_permanent_error_naming_those_that_are():
    with pytest.raises(ImageError, match=r"no containers/tfcpu.Dockerfile .*tf-cpu.Dockerfile") as failure:
        source_files("tfcpu.Dockerfile")
    assert failure.value.permanent


@pytest.fixture
def fake_wheelhouses(tmp_path, monkeypatch) -> list[str]:
    """wheelhouse() without pip: a folder per requirements file with one wheel named after it; the files asked for."""
    asked = []

    def wheelhouse(python, cache, requirements="image.txt"):
        asked.append(requirements)
        folder = tmp_path / "cache" / requirements
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{requirements}-py{python}.whl").write_text(requirements)
        (folder / ".complete").write_text("")
        return folder

    monkeypatch.setattr(build_context, "wheelhouse", wheelhouse)
    return asked


@pytest.mark.parametrize(
    "name, wheels",
    [
        ("cpu", ["image.txt"]),
        ("tf-cpu", ["image.txt", "tensorflow.txt", "tf-keras.txt"]),  # TensorFlow's wheels, for a build with no index
        ("gpu", []),  # the GPU images install from the index
        ("tf-gpu", []),
    ],
)
def test_the_cpu_contexts_carry_the_wheels_of_their_requirements(tmp_path, fake_wheelhouses, name, wheels):
    context = assemble_context(f"{name}.Dockerfile", tmp_path / "ctx", "3.11", tmp_path / "cache")
    assert fake_wheelhouses == wheels
    assert sorted(p.name for p in (context / "wheels").iterdir()) == sorted(f"{w}-py3.11.whl" for w in wheels)
    assert (context / "Dockerfile").read_bytes() == (CONTAINERS / f"{name}.Dockerfile").read_bytes()


def test_the_stack_names_the_image_and_its_tag_covers_the_dockerfile(tmp_path, fake_wheelhouses):
    cfg = ImageConfig(registry="localhost:5000")
    torch_ref, tf_ref = (image_ref(cfg, tmp_path / stack, tmp_path / "cache", None, stack) for stack in ("", "tf-"))
    assert (torch_ref.name, tf_ref.name) == ("localhost:5000/trainflow-cpu", "localhost:5000/trainflow-tf-cpu")
    assert torch_ref.tag != tf_ref.tag


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
    assert (
        ImageConfig().image_name("tf-") == "trainflow-tf-cpu" and ImageConfig().dockerfile("tf-") == "tf-cpu.Dockerfile"
    )
    assert ImageConfig(flavour="gpu").image_name("tf-") == "trainflow-tf-gpu"
    assert ImageConfig(repository="team/x").image_name("tf-") == "team/x"  # one repository, told apart by the tags
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
    runs = {name: runs_of(name) for name in TORCH_IMAGES + TF_IMAGES}
    assert "requirements/dali.txt" in runs["gpu"] and not [
        name for name in runs if "dali" in runs[name] and name != "gpu"
    ]
