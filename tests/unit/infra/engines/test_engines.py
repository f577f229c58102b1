"""The engine (framework) seam: training.framework chooses the trainer's section; a second engine is one class
and one registry line; the run fingerprint and the digits recipe each have one home."""

from typing import ClassVar, Literal

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from flows.config import DEMO, DIGITS_TRAINING, ConfigError, load_config
from flows.recipes import load_with_recipe
from infra.engines import DEFAULT, ENGINES, one_of
from infra.engines.contract import PACKAGE, TrainingSettings, trainer_argv
from infra.engines.pytorch import PyTorchTraining
from infra.engines.tensorflow import KerasTraining, TensorFlowTraining
from infra.runs.ledger import estimate_key
from infra.runs.record import run_inputs
from tests.fakes.paths import REPO

UNKNOWN = "invalid setting training.framework = 'mxnet': Input should be 'pytorch', 'tensorflow' or 'keras'"


def test_pytorch_is_the_default_of_three_frameworks():
    cfg = load_config(None, {})
    assert (DEFAULT, cfg.training.framework) == ("pytorch", "pytorch")
    assert list(ENGINES) == ["pytorch", "tensorflow", "keras"]
    assert isinstance(cfg.training, PyTorchTraining)


@pytest.mark.parametrize(
    "framework, section, entry, stack",
    [
        ("tensorflow", TensorFlowTraining, "trainer/tf/loop.py", "tf-"),
        ("keras", KerasTraining, "trainer/tf/fit.py", "tf-"),
    ],
)
def test_tensorflow_and_keras_train_under_horovodrun_in_their_own_image(framework, section, entry, stack):
    cfg = load_config(None, {"training": {"framework": framework}})
    assert isinstance(cfg.training, section)
    assert (cfg.training.launcher, cfg.training.ENTRY, cfg.training.IMAGE_STACK) == ("horovodrun", entry, stack)
    assert (PACKAGE.parent / entry).is_file()
    assert PyTorchTraining.IMAGE_STACK == ""
    # the options every framework shares, with the same defaults
    shared = set(section.model_fields) - {"framework", "launcher"}
    assert shared < set(PyTorchTraining.model_fields)
    assert {k: getattr(cfg.training, k) for k in shared} == {k: getattr(PyTorchTraining(), k) for k in shared}


@pytest.mark.parametrize("framework", ["tensorflow", "keras"])
def test_a_framework_that_cannot_run_under_the_launcher_is_one_line(framework):
    with pytest.raises(ConfigError) as raised:
        load_config(None, {"training": {"framework": framework, "launcher": "torchrun"}})
    assert str(raised.value) == (
        f"invalid config: training.framework {framework} trains under horovodrun only (torchrun starts PyTorch "
        "workers): set training.launcher: horovodrun, or leave it unset"
    )
    with pytest.raises(ConfigError, match="training.loader"):  # PyTorch's own options are not theirs
        load_config(None, {"training": {"framework": framework, "loader": "pil"}})


def test_the_demo_recipe_changes_framework_by_one_line(tmp_path):
    demo = yaml.safe_load(DEMO.read_text())
    demo["training"]["framework"] = "keras"
    (tmp_path / "keras.yaml").write_text(yaml.safe_dump(demo))
    cfg = load_config(tmp_path / "keras.yaml", {})
    assert isinstance(cfg.training, KerasTraining) and cfg.training.launcher == "horovodrun"
    assert {k: getattr(cfg.training, k) for k in DIGITS_TRAINING} == DIGITS_TRAINING


@pytest.mark.parametrize("source", ["option", "environment"])
def test_an_unknown_framework_is_one_line_naming_the_choices(source):
    overrides = {"training": {"framework": "mxnet"}} if source == "option" else {}
    environ = {"TRAINFLOW_TRAINING__FRAMEWORK": "mxnet"} if source == "environment" else {}
    with pytest.raises(ConfigError) as raised:
        load_config(None, overrides, environ)
    assert str(raised.value) == UNKNOWN


def test_the_command_line_starts_the_engine_s_entry_point_under_the_scripts_folder():
    argv = trainer_argv(PyTorchTraining(epochs=1), "/data", "/out", "/scripts/v1")
    assert argv[:5] == ["/scripts/v1/trainer/train.py", "--data", "/data", "--out", "/out"]
    assert trainer_argv(PyTorchTraining(), "D", "O")[0] == f"{PACKAGE}/train.py"
    assert (PACKAGE / "train.py").is_file()


class Other(TrainingSettings):
    """A second framework's section, as a new engine module would write it."""

    ENTRY: ClassVar[str] = "trainer/other.py"
    framework: Literal["other"] = "other"
    steps: int = 1


class Section(BaseModel):
    training: one_of({"pytorch": PyTorchTraining, "other": Other})  # type: ignore[valid-type]  # made at run time


def test_a_second_engine_is_chosen_by_framework_and_the_default_stays_pytorch():
    assert isinstance(Section.model_validate({"training": {"framework": "other", "steps": 3}}).training, Other)
    assert isinstance(Section.model_validate({"training": {"epochs": 2}}).training, PyTorchTraining)
    with pytest.raises(ValidationError, match="steps"):  # each engine's own settings, refused by the other
        Section.model_validate({"training": {"steps": 3}})
    with pytest.raises(ValidationError, match="'pytorch', 'other'"):
        Section.model_validate({"training": {"framework": "keras"}})


def test_the_run_fingerprint_and_the_estimate_key_share_the_settings_and_differ_where_they_should():
    cfg = load_config(None, {"data": "synthetic"})
    other = load_config(None, {"data": "synthetic", "training": {"epochs": 3}})
    assert run_inputs(cfg, "v1", "d1") != run_inputs(other, "v1", "d1")  # the settings: both
    assert estimate_key(cfg) != estimate_key(other)
    assert run_inputs(cfg, "v1", "d1") != run_inputs(cfg, "v2", "d1")  # the versions: the run's only
    assert estimate_key(cfg) == estimate_key(load_config(None, {"data": "synthetic"}))


def test_the_digits_recipe_has_one_home_that_the_nightly_deployment_repeats():
    demo = yaml.safe_load(DEMO.read_text())["training"]
    assert {k: v for k, v in demo.items() if k not in ("launcher", "workers")} == DIGITS_TRAINING
    for deployment in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]:
        assert deployment["parameters"]["cfg"]["training"] == demo
    fitted = load_with_recipe(None, {})[0].training
    assert {k: getattr(fitted, k) for k in DIGITS_TRAINING} == DIGITS_TRAINING


@pytest.mark.parametrize("command", [["train"], ["run", "--dry-run"]])
def test_the_commands_take_framework_and_refuse_another_in_one_line_with_exit_2(command, tmp_path):
    from typer.testing import CliRunner

    from cli import app

    assert "--framework" in CliRunner().invoke(app, [command[0], "--help"]).output
    result = CliRunner().invoke(app, [*command, "--framework", "mxnet", "--workdir", str(tmp_path / "w")])
    assert (result.exit_code, result.output.strip()) == (2, f"error: {UNKNOWN}")
    mismatch = [*command, "--framework", "keras", "--workdir", str(tmp_path / "w")]
    result = CliRunner().invoke(app, mismatch, env={"TRAINFLOW_TRAINING__LAUNCHER": "torchrun"})
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: invalid config: training.framework keras trains under horovodrun")
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()
