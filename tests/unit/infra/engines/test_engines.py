"""The engine (framework) seam: training.framework chooses the trainer's section; a second engine is one class
and one registry line; the run fingerprint and the digits recipe each have one home."""

from typing import ClassVar, Literal

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from flows.config import DEMO, DIGITS_TRAINING, ConfigError, load_config
from infra.engines import DEFAULT, ENGINES, one_of
from infra.engines.contract import PACKAGE, TrainingSettings, trainer_argv
from infra.engines.pytorch import PyTorchTraining
from infra.runs.ledger import estimate_key
from infra.runs.record import run_inputs
from tests.fakes.paths import REPO


def test_pytorch_is_the_default_and_only_framework():
    cfg = load_config(None, {})
    assert (DEFAULT, list(ENGINES), cfg.training.framework) == ("pytorch", ["pytorch"], "pytorch")
    assert isinstance(cfg.training, PyTorchTraining)


@pytest.mark.parametrize("source", ["option", "environment"])
def test_an_unknown_framework_is_one_line_naming_the_choices(source):
    overrides = {"training": {"framework": "tensorflow"}} if source == "option" else {}
    environ = {"TRAINFLOW_TRAINING__FRAMEWORK": "tensorflow"} if source == "environment" else {}
    with pytest.raises(ConfigError) as raised:
        load_config(None, overrides, environ)
    assert str(raised.value) == "invalid setting training.framework = 'tensorflow': Input should be 'pytorch'"


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
    fitted = load_config(None, {}, digits_defaults=True).training
    assert {k: getattr(fitted, k) for k in DIGITS_TRAINING} == DIGITS_TRAINING


@pytest.mark.parametrize("command", [["train"], ["run", "--dry-run"]])
def test_the_commands_take_framework_and_refuse_another_in_one_line_with_exit_2(command, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    assert "--framework" in CliRunner().invoke(app, [command[0], "--help"]).output
    result = CliRunner().invoke(app, [*command, "--framework", "tensorflow", "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 2
    assert (
        result.output.strip() == "error: invalid setting training.framework = 'tensorflow': Input should be 'pytorch'"
    )
    assert not (tmp_path / "w").exists()
