"""The install in layers: `make demo` installs only what the local default uses (no root, no TensorFlow, no Horovod
build), a run that needs a missing layer is refused in one line naming the command that installs it, and `trainflow
doctor` shows what the machine has. The layers are missing here by making their modules unimportable, as a venv
without them has them (sys.modules[name] = None: import and find_spec both report them absent)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.doctor import node_too_old
from tests.fakes.paths import REPO

pytestmark = pytest.mark.integration
OUTER = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under make test


def trainflow_without(modules: list[str], args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """`trainflow ARGS` in this venv with `modules` unimportable."""
    hidden = "".join(f"sys.modules[{m!r}] = None; " for m in modules)
    code = f"import sys; {hidden}from cli import app; sys.argv = ['trainflow', *sys.argv[1:]]; app()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "hidden, args, line",
    [
        (
            ["tensorflow"],
            ["--framework", "keras"],
            "error: training.framework keras with horovodrun on this machine needs TensorFlow and tf_keras, which "
            "this venv lacks; install it with `make setup-tensorflow` (about 1.4 GB, a minute)",
        ),
        (
            ["horovod"],
            ["--launcher", "horovodrun"],
            "error: training.framework pytorch with horovodrun on this machine needs Horovod, which this venv lacks; "
            "install it with `make setup-horovod` (compiled once, 4 to 10 minutes on 2 cores)",
        ),
    ],
)
def test_a_run_that_needs_a_missing_layer_says_which_command_installs_it(tmp_path, hidden, args, line):
    for command in (["run", "--dry-run"], ["train", "--data", "synthetic"]):
        done = trainflow_without(hidden, [*command, *args, "--workdir", str(tmp_path / "w")])
        assert (done.returncode, done.stderr.strip()) == (2, line), done.stdout + done.stderr
        assert not (tmp_path / "w").exists()


def test_the_pytorch_default_needs_neither_tensorflow_nor_horovod(tmp_path):
    done = trainflow_without(["tensorflow", "horovod"], ["run", "--dry-run", "--workdir", str(tmp_path / "w")])
    assert done.returncode == 0, done.stderr


def test_doctor_shows_every_part_and_fails_only_for_what_the_local_default_needs(tmp_path):
    done = trainflow_without([], ["doctor", "--workdir", str(tmp_path)], {"COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        line.split("│")[1].strip(): line.split("│")[3].strip()
        for line in done.stdout.splitlines()
        if line.startswith("│") and line.split("│")[1].strip()
    }
    assert rows["Python (needed)"] == f"✓ {'.'.join(map(str, sys.version_info[:3]))}"
    assert rows["Node.js and Azurite (needed)"].startswith("✓ node v")
    assert rows["TensorFlow and tf_keras"] == "✓ installed"
    assert rows["Horovod"] == "✓ built with PyTorch and TensorFlow"
    assert rows["Free disk in the workdir (needed)"].endswith(f"GB free at {tmp_path}")
    assert set(rows) >= {"C compiler and libjpeg", "CUDA GPUs and NCCL", "Docker engine and registry"}

    no_node = {
        "PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "node").exists())
    }
    missing = trainflow_without(["tensorflow"], ["doctor", "--workdir", str(tmp_path)], {**no_node, "COLUMNS": "200"})
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert "✗ install Node.js 20 or newer" in missing.stdout and "✗ make setup-tensorflow" in missing.stdout


def test_doctor_names_a_stopped_docker_engine_an_old_node_and_a_workdir_that_is_a_file(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    stopped = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock", "COLUMNS": "500"}  # the real client, no engine
    done = trainflow_without([], ["doctor", "--workdir", str(tmp_path / "a-file")], stopped)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "✗ Docker is installed but its engine does not answer: start it" in done.stdout  # make test installs it
    assert f"✗ workdir {tmp_path / 'a-file'}: {tmp_path / 'a-file'} is a file, not a folder" in done.stdout
    assert node_too_old("v12.22.9") == "node v12.22.9 is too old for Azurite: install Node.js 20 or newer"
    assert node_too_old("v20.20.2") == node_too_old("v22.1.0") == ""


def test_doctor_into_an_80_column_pipe_keeps_every_value_whole(tmp_path):
    workdir = tmp_path / "a workdir whose path is longer than the eighty columns of the terminal it is piped from"
    done = trainflow_without([], ["doctor", "--workdir", str(workdir)], {"COLUMNS": "80"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"GB free at {workdir} │" in done.stdout and "…" not in done.stdout


def test_doctor_names_a_prefect_api_url_that_does_not_answer(tmp_path):
    env = {"COLUMNS": "250", "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    done = trainflow_without([], ["doctor", "--workdir", str(tmp_path)], env)
    assert done.returncode == 1
    assert "✗ PREFECT_API_URL=http://127.0.0.1:9/api does not answer as Prefect's API; unset it" in done.stdout


def make_plan(*args: str) -> str:
    """What `make ARGS` would run, everything considered out of date (-B), without running it."""
    return subprocess.run(
        ["make", "-n", "-B", *args], cwd=REPO, capture_output=True, text=True, check=True, env=OUTER
    ).stdout


def test_make_demo_installs_only_the_base_and_azurite_without_root():
    demo = make_plan("demo")
    assert "-j2 .venv/.base node_modules/.installed\n" in demo
    parts = make_plan(".venv/.base", "node_modules/.installed")
    assert "-e ." in parts and "npm ci" in parts
    for needs_root_or_more in ("sudo", "apt-get", "tensorflow", "horovod", "checkov", "chromium", "docker"):
        assert needs_root_or_more not in parts, needs_root_or_more


def test_the_layers_are_installed_by_uv_from_the_lock_unless_pip_is_asked_for():
    uv, pip = make_plan(".venv/.base"), make_plan(".venv/.base", "INSTALLER=pip")
    assert ".venv/bin/pip install -q -c containers/requirements/constraints.txt uv\n" in uv
    # containers/build/install.sh (tests/integration/cli/test_install_certificates.py runs it against a TLS index)
    assert "INSTALLER=uv containers/build/install.sh .venv/bin -c containers/requirements/constraints.txt" in uv
    assert "pip install" not in pip and "INSTALLER=pip containers/build/install.sh .venv/bin -c " in pip


@pytest.mark.parametrize(
    "args, layers",
    [
        (["FRAMEWORK=keras"], ".venv/.base node_modules/.installed .venv/.tensorflow .venv/.horovod"),
        (["LAUNCHER=horovodrun"], ".venv/.base node_modules/.installed .venv/.horovod"),
    ],
)
def test_make_demo_installs_the_layer_its_framework_or_launcher_needs(args, layers):
    assert f"-j2 {layers}" in make_plan("demo", *args)


def test_horovod_is_built_after_tensorflow_where_tensorflow_is_wanted(tmp_path):
    venv = tmp_path / "venv"  # a fresh clone's venv (this checkout's may hold the TensorFlow layer already)
    plan = make_plan(f"{venv}/.horovod", f"VENV={venv}", "FRAMEWORK=keras")
    assert -1 < plan.find("tensorflow-cpu==") < plan.find("horovod-wheel.sh")
    assert "tensorflow-cpu==" not in make_plan(f"{venv}/.horovod", f"VENV={venv}")  # PyTorch alone: without it
    venv.mkdir()
    (venv / ".tensorflow").touch()  # installed before (make setup-tensorflow): Horovod is built with it
    plan = make_plan(f"{venv}/.horovod", f"VENV={venv}")
    assert -1 < plan.find("tensorflow-cpu==") < plan.find("horovod-wheel.sh")
