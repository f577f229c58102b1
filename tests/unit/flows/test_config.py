"""FlowConfig loading: its sources and their precedence, sections, the errors that name the setting, the example
configs and prefect.yaml's deployment."""

import pytest

from flows.config import DIGITS_TRAINING, ConfigError, FlowConfig, load_config, section_type
from flows.recipes import load_with_recipe
from tests.fakes.paths import REPO


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"batch_size": 0}, "training.batch_size must be at least 1"),
        ({"lr": 0}, "training.lr must be positive"),
        ({"stages": 2}, "training.stages needs training.parallel pipeline"),
        ({"parallel": "pipeline", "stages": 2, "workers": 3}, "not a multiple of training.stages 2"),
        ({"parallel": "pipeline", "stages": 2, "launcher": "horovodrun"}, "Horovod has no pipeline parallelism"),
        ({"batch_size": 30, "microbatches": 4}, "training.batch_size 30 is not divisible by training.microbatches 4"),
    ],
)
def test_the_trainers_own_checks_refuse_a_config_naming_the_setting(settings, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, {"training": settings}, environ={})


def test_no_data_means_the_digits_set_with_settings_that_fit_it():
    fitted = load_with_recipe(None, {"training": {"epochs": 2}}, environ={})[0].training
    assert (fitted.model, fitted.image_size, fitted.epochs) == (DIGITS_TRAINING["model"], 32, 2)  # the user's own wins
    named = load_with_recipe(None, {"data": "/data/imagenet"}, environ={})[0].training  # no images there to size
    assert (named.model, named.epochs, named.image_size) == ("resnet50", 90, 224)  # the reference recipe
    chosen = load_with_recipe(None, {"training": {"model": "resnet50"}}, environ={})[0].training
    assert (chosen.epochs, chosen.image_size) == (90, 224)  # a config that picks its model keeps the reference


def test_precedence_is_options_then_environment_then_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training: {epochs: 3, model: resnet18, batch_size: 8}\nworkdir: /from/file\n")
    env = {"TRAINFLOW_TRAINING__EPOCHS": "5", "TRAINFLOW_TRAINING__BATCH_SIZE": "16"}
    cfg = load_config(path, {"training": {"epochs": 7, "batch_size": None}}, environ=env)
    assert (cfg.training.epochs, cfg.training.batch_size, cfg.training.model) == (7, 16, "resnet18")
    assert str(cfg.workdir) == "/from/file"


@pytest.mark.parametrize(
    "text, message",
    [
        ("training: {batch_size: 0}", r"training.batch_size must be at least 1 \(got 0\)"),
        ("training: {epochs: many}", r"training.epochs = 'many': Input should be a valid integer"),
        # a number or auto: one message, not one for each type pydantic tried
        (
            "training: {loader_workers: many}",
            r"training.loader_workers = 'many': Input should be a valid integer or 'auto' \(",
        ),
        ("training: {loader_workers: -1}", r"training.loader_workers must not be negative \(got -1\)"),
        ("training: {epoch: 3}", r"training.epoch: Extra inputs are not permitted"),
        ("training: [1, 2", "is not valid YAML"),
        ("- a list", "must hold a mapping"),
    ],
)
def test_bad_config_files_name_the_setting(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path, {}, environ={})


SECTIONS = [name for name, field in FlowConfig.model_fields.items() if section_type(field)]


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize(
    "value, kind", [(3, "a number"), ("epochs=3", "a string"), ([1, 2], "a list"), (True, "true or false")]
)
def test_a_section_given_a_single_value_is_refused_from_every_source(tmp_path, section, value, kind):
    """Merging used to replace such a value with the defaults (or another source's mapping) without a word."""
    path = tmp_path / "c.yaml"
    path.write_text(f"{section}: {value if not isinstance(value, bool) else 'true'}\n")
    with pytest.raises(
        ConfigError,
        match=rf"^{section} from config file {path} is {kind}, but {section} is a section "
        rf"of settings: write them as a mapping \({section}: ",
    ):
        load_config(path, {section: {}}, environ={})  # an option for the section, as the CLI passes, must not hide it
    variable = f"TRAINFLOW_{section.upper()}"
    with pytest.raises(
        ConfigError,
        match=rf"^{section} from environment variable {variable} is a string, but .*unset "
        rf"{variable} and set each setting as {variable}__<SETTING>=<value>$",
    ):
        load_config(None, {}, environ={variable: str(value)})
    with pytest.raises(ConfigError, match=rf"^{section} from the command-line options is {kind}, but"):
        load_config(None, {section: value}, environ={})


def test_an_empty_section_in_a_file_is_the_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  # epochs: 3\nstorage:\n")
    assert load_config(path, {"training": {"epochs": 2}}, environ={}).training.epochs == 2


@pytest.mark.parametrize(
    "environ, message",
    [
        (
            {"TRAINFLOW_TRAINING": "x", "TRAINFLOW_TRAINING__EPOCHS": "3"},
            "environment variables TRAINFLOW_TRAINING and TRAINFLOW_TRAINING__EPOCHS conflict",
        ),
        (
            {"TRAINFLOW_STORAGE__CONTAINER": "abc", "TRAINFLOW_STORAGE__CONTAINER__NAME": "x"},
            "TRAINFLOW_STORAGE__CONTAINER and TRAINFLOW_STORAGE__CONTAINER__NAME conflict",
        ),
        ({"TRAINFLOW_POOL__NODES__X": "1", "TRAINFLOW_pool__nodes": "2"}, "TRAINFLOW_pool__nodes sets pool.nodes"),
    ],
)
def test_variables_that_set_a_setting_and_its_inside_are_refused(environ, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, {}, environ=environ)


@pytest.mark.parametrize(
    "text, where",
    [
        (
            "training: [1, 2\n",
            r"at line 2, column 1: expected ',' or '\]', but got '<stream end>' \(while parsing a "
            r"flow sequence from line 1, column 11\)",
        ),
        (
            "training:\n  epochs: 3\n\tmodel: resnet18\n",
            r"at line 3, column 1: found character '\\t' that cannot "
            "start any token",
        ),
        ("storage: {container: 'abc}\n", "at line 2, column 1: found unexpected end of stream"),
        ("a: b: c\n", "at line 1, column 5: mapping values are not allowed here"),
    ],
)
def test_invalid_yaml_is_named_with_its_line_and_column(tmp_path, text, where):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^config file {path} is not valid YAML {where}"):
        load_config(path, {}, environ={})


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml", {}, environ={})


def test_the_example_configs_load():
    repo = REPO
    for path in sorted((repo / "flows" / "configs").glob("*.yaml")):
        load_config(path, {}, environ={})


def test_unknown_trainflow_variable_is_named_without_its_value():
    with pytest.raises(
        ConfigError, match="environment variable TRAINFLOW_REGISTRY_PASSWORD names no setting"
    ) as failure:
        load_config(None, {}, environ={"TRAINFLOW_REGISTRY_PASSWORD": "s3cret-value"})
    assert "s3cret-value" not in str(failure.value)


def test_a_docker_pool_that_torchrun_cannot_split_evenly_is_refused():
    with pytest.raises(
        ConfigError,
        match="training.workers 3 does not split evenly .* make training.workers a multiple of pool.slots_per_node",
    ):
        load_config(
            None,
            {"pool": {"backend": "docker", "nodes": 2, "slots_per_node": 2}, "training": {"workers": 3}},
            environ={},
        )
    load_config(
        None,
        {
            "pool": {"backend": "docker", "nodes": 2, "slots_per_node": 2},
            "training": {"workers": 3, "launcher": "horovodrun"},
        },
        environ={},
    )


def test_prefect_yaml_deploys_the_pipeline_with_valid_parameters():
    import importlib

    import yaml

    from flows.config import FlowConfig

    repo = REPO
    for deployment in yaml.safe_load((repo / "prefect.yaml").read_text())["deployments"]:
        path, name = deployment["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
        assert flow.name == "train-flow"
        FlowConfig.model_validate(deployment["parameters"]["cfg"])
        assert deployment["schedules"][0]["cron"]


@pytest.mark.parametrize("source", ["file", "environment"])
def test_a_backend_section_of_the_old_format_says_where_its_settings_went(source, tmp_path):
    config = tmp_path / "old.yaml"
    config.write_text("pool: {backend: azureml}\nazureml: {vm_size: Standard_ND96asr_v4}\n")
    environ = {"TRAINFLOW_AZUREML__VM_SIZE": "Standard_ND96asr_v4"} if source == "environment" else {}
    with pytest.raises(
        ConfigError,
        match=r"^invalid config: there is no azureml: section: the azureml pool's "
        r"settings now live under pool:, with backend: azureml .* move them there",
    ):
        load_config(config if source == "file" else None, {}, environ)


@pytest.mark.parametrize(
    "name, meant",
    [
        ("TRAINFLOW_EPOCHS", "TRAINFLOW_TRAINING__EPOCHS"),
        ("TRAINFLOW_TRAINING__EPOHCS", "TRAINFLOW_TRAINING__EPOCHS"),
        ("TRAINFLOW_STORAGE__CONTAINR", "TRAINFLOW_STORAGE__CONTAINER"),
    ],
)
def test_a_variable_that_names_no_setting_is_refused_with_the_setting_it_likely_meant(name, meant):
    with pytest.raises(ConfigError, match=f"^environment variable {name} names no setting; did you mean {meant}?"):
        load_config(None, {}, environ={name: "3"})


@pytest.mark.parametrize(
    "name", ["TRAINFLOW_JPEG_CROP_DIR", "TRAINFLOW_TEST_FREE_GIB", "TRAINFLOW_TEST_REGISTRY", "TRAINFLOW_REPO"]
)
def test_the_projects_other_variables_are_never_read_as_settings(name):
    assert load_config(None, {}, environ={name: "/somewhere"}) == load_config(None, {}, environ={})


def guide_config(page: str = "own-script.md") -> str:
    """The YAML block of a guide."""
    return (REPO / "docs" / "guides" / page).read_text().split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_own_script_guides_config_file_runs_the_script_on_the_process_pool(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the guide names the example by its path in the checkout
    (tmp_path / "script.yaml").write_text(guide_config())
    cfg = load_config(tmp_path / "script.yaml", {}, environ={})
    assert cfg.script is not None and cfg.script.source == REPO / "containers" / "examples" / "pytorch-segmentation"
    assert cfg.script.entry_argv() == ["train.py"] and cfg.script.metrics == {"iou": "iou=([0-9.]+)"}
    assert cfg.data == "synthetic"  # a script's data is only what it names


def test_a_script_runs_on_every_pool_and_a_missing_folder_is_refused_before_anything_starts(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    values = {"script": {"source": "containers/examples/pytorch-segmentation", "entry": "train.py"}}
    azure = load_config(REPO / "flows" / "configs" / "azure.yaml", values, environ={})
    docker = load_config(None, {**values, "pool": {"backend": "docker", "nodes": 2}}, environ={})
    assert azure.script is not None and docker.script is not None
    with pytest.raises(ConfigError, match=r"nowhere: no such folder; give the folder that holds your training script"):
        load_config(None, {"script": {"source": str(tmp_path / "nowhere"), "entry": "train.py"}}, environ={})
