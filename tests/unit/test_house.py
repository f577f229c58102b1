"""The house rules that hold across modules: the import contracts (pyproject.toml's [tool.importlinter], checked by
import-linter: the layers, the trainer standing apart), one error hierarchy with one retry and one exit-code rule,
every command reading its config one way, each backend refusing what it cannot run, the documented commands, and
the test suite's own groups."""

import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from azure.core.exceptions import AzureError

import infra
from cli.common import configure
from flows.config import ConfigError, load_config
from infra.core.errors import BadInput, TrainflowError, exit_code, is_permanent
from tests.fakes.paths import REPO


def errors_of_infra() -> list[type]:
    found = set()
    for module in pkgutil.walk_packages(infra.__path__, "infra."):
        for _, value in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if issubclass(value, Exception) and value.__module__.startswith("infra."):
                found.add(value)
    return sorted(found, key=lambda c: c.__name__)


def test_every_error_of_infra_is_in_the_one_hierarchy_with_one_exit_rule():
    errors = errors_of_infra()
    assert len(errors) >= 8
    for error in errors:
        assert issubclass(error, TrainflowError), error
        assert exit_code(error("x")) == (2 if issubclass(error, BadInput) else 1), error
    assert issubclass(ConfigError, BadInput) and exit_code(ConfigError("x")) == 2
    assert exit_code(AzureError("refused")) == 1 and exit_code(ValueError("a bug")) is None


def test_the_retry_rule_is_the_permanent_flag():
    assert is_permanent(BadInput("x")) and not is_permanent(TrainflowError("x"))
    assert is_permanent(TrainflowError("x", permanent=True)) and not is_permanent(RuntimeError("x"))


def test_commands_without_data_get_the_digits_settings_and_an_absolute_workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    digits = configure(None, None, Path("work"))
    assert digits.workdir == tmp_path / "work" and (digits.training.model, digits.training.image_size) == (
        "resnet18",
        32,
    )
    real = configure(None, "/data/imagenet", None)
    assert (real.training.model, real.training.image_size, real.training.epochs) == ("resnet50", 224, 90)


@pytest.mark.parametrize("backend", ["process", "docker"])
def test_a_local_pool_with_an_azure_share_is_refused(backend):
    with pytest.raises(ConfigError, match="set fileshare.backend: local") as failure:
        load_config(None, {"pool": {"backend": backend}, "fileshare": {"backend": "azure"}}, environ={})
    assert failure.value.exit_code == 2


def command_paths(group, prefix: str = "trainflow") -> list[str]:
    """Every command of a click group, as `trainflow bench train`; a group that runs by itself too (`trainflow
    runs`) is a command as well."""
    paths = []
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        itself = [path] if getattr(command, "invoke_without_command", False) else []
        paths += itself + command_paths(command, path) if hasattr(command, "commands") else [path]
    return paths


def test_the_table_of_commands_lists_every_command():
    """The table of commands (docs/getting-started.md) has a row for each command the CLI has, and none it lacks."""
    import typer

    from cli import app

    page = (REPO / "docs" / "getting-started.md").read_text()
    listed = set(re.findall(r"^\| `(trainflow [a-z -]+?)(?: \[|`)", page, re.MULTILINE))
    assert listed == set(command_paths(typer.main.get_command(app)))


def test_the_import_contracts_hold():
    """pyproject.toml's [tool.importlinter] contracts (the layers flows -> tasks -> infra and infra's own, the
    benchmarks and the trainer apart), checked by import-linter from this Python's environment (`make lint` runs
    the same command)."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.exists(), f"{lint_imports} is missing: `make setup` installs import-linter (the dev extra)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "containers")])}
    done = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


def test_the_trainer_imports_nothing_of_the_orchestrator():
    """The trainer runs on the nodes without the orchestrator's packages: every one of its modules loads in a fresh
    Python without importing them, or Prefect (an external package, which the import contracts do not see)."""
    probe = (
        "import importlib, pkgutil, sys, trainer\n"
        "for module in pkgutil.walk_packages(trainer.__path__, 'trainer.'):\n"
        "    importlib.import_module(module.name)\n"
        "print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "containers")}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO / "containers", env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not set(done.stdout.split()) & {"flows", "tasks", "infra", "benchmarks", "prefect"}


def test_every_group_of_the_suite_names_a_module_that_exists(request):
    """tests/conftest.py's groups (tests/fakes/xdist_groups.py) are registered and name test modules that exist: a
    module moved without its group's line would leave its tests to any worker, or stop the run."""
    groups = request.config.pluginmanager.get_plugin("trainflow-groups")
    assert groups is not None and {"docker", "loaders", "bad-inputs"} <= set(groups.modules.values())
    for module in groups.modules:
        assert (request.config.rootpath / module).is_file(), module


def test_the_pre_commit_hooks_run_what_make_lint_runs():
    """.pre-commit-config.yaml runs the commands of `make lint` (the project's own pinned tools from .venv)."""
    import yaml

    lint = re.search(r"^lint: .*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert lint, "the Makefile has no lint target"
    made = {line.replace("$(BIN)/", "") for line in lint.group(1).splitlines()}
    made = {" ".join(w for w in m.split() if not w.startswith("$(") and w != ".") for m in made}
    hooks = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    entries = {hook["entry"].replace("--force-exclude", "").replace(".venv/bin/", "") for hook in hooks}
    entries = {" ".join(w for w in e.split() if w != "env" and "=" not in w) for e in entries}
    assert entries == made, (entries, made)
