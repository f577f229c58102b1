"""FlowConfig: the one typed configuration, from a YAML file, the environment and the command line.

Precedence, highest first: command-line options, TRAINFLOW_* environment variables
(TRAINFLOW_TRAINING__EPOCHS=3 sets training.epochs), the --config file, the defaults.
Each section lives next to the code that owns it, and takes a mapping from every source.
No setting holds a secret: Prefect stores the whole config with every run, so secrets come from the
environment variables that the *_env settings name, and a secret-shaped value anywhere is refused unshown.
"""

import difflib
import os
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from infra.compute import BACKENDS, JobConfig, PoolConfig, ProcessPoolConfig, backend_of, refuse_backend_sections
from infra.core.errors import BadInput, first_line
from infra.core.redact import ENV_NAME_ERROR, names_a_variable, redact, secret_shapes
from infra.data.manifest import check_dataset_name
from infra.data.shrink import check_max_side
from infra.engines import TrainingConfig, default_training
from infra.engines.contract import SYNTHETIC
from infra.engines.script import SCRIPT_REFUSED, ScriptConfig, check_placeholders
from infra.engines.script_requirements import requirements_of
from infra.images.registry import ImageConfig
from infra.runs.ledger import CostConfig
from infra.runs.lineage import check_weights, weights_file
from infra.runs.tracking import TrackingConfig
from infra.storage.config import StorageConfig
from infra.storage.fileshare import FileShareConfig
from nodelib.errors import UsageError
from nodelib.layout import FILES_LAYOUT, IMAGENET_LAYOUT
from trainer.model_files import IMAGENET

ENV_PREFIX = "TRAINFLOW_"
DEMO = Path(__file__).parent / "configs" / "demo.yaml"
# The digits recipe (its one home is the demo config): the training settings that fit the digits set, which a
# config that names neither data nor a model trains with (flows/recipes.py); the demo's launcher and workers are not
# part of it.
DIGITS_TRAINING = {
    k: v for k, v in yaml.safe_load(DEMO.read_text())["training"].items() if k not in ("launcher", "workers")
}
STAGED = "staged"  # data: train on the data set already in Blob storage under `dataset`
LOCAL_DATA_FREE = (SYNTHETIC, STAGED)  # values of `data` that name no local folder


class ConfigError(BadInput):
    """A config file or option that cannot be used; the message names the setting and the fix."""

    def __init__(self, message: str):
        super().__init__(redact(message))  # a value quoted from a file or option may hold a secret


class FlowConfig(BaseModel):
    """Everything one run of the flow needs."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    workdir: Path = Path(".trainflow")
    """Root of all local state: data, file share, file server, storage emulator data, results."""
    data: str | None = None
    """ImageNet-layout folder (named without a config file: trained with the recipe its images fit, photographs
    flows/configs/photos.yaml's, small images the digits'; flows/recipes.py); "synthetic"; "staged": the data set
    already in Blob under `dataset`, nothing uploaded (scheduled runs on a machine without the local copy); unset:
    the small digits set, written under workdir on first use, with training defaults that fit it (a run of minutes:
    flows/configs/demo.yaml's recipe)."""
    dataset: str | None = None
    """Name of the data set in Blob and on the file server; unset: the data folder's name."""
    max_side: int | None = None
    """Shrink at staging: every JPEG or PNG whose longer side exceeds this many pixels (32 or more; 500 is what FFCV
    uses for ResNet-50) is staged re-encoded at it (JPEG at quality 90, PNG lossless; aspect kept), from a copy kept
    under workdir/shrunk/<data set>-<N>; the data folder is never written. Part of the data version: a change re-stages.
    Unset: the images are staged as they are."""
    training: TrainingConfig = Field(default_factory=default_training)
    """How the trainer runs (every option of containers/trainer/train.py, the launcher and the workers)."""
    script: ScriptConfig | None = None
    """A training script of your own, run instead of trainflow's trainer (`trainflow run --script DIR -- ENTRY`);
    unset: trainflow's trainer. Training's framework, launcher and workers say how it runs."""
    storage: StorageConfig = StorageConfig()
    """Blob storage for the data set."""
    fileshare: FileShareConfig = FileShareConfig()
    """The file share for the training scripts."""
    pool: PoolConfig = ProcessPoolConfig()
    """Where the workers run: the compute backend (`backend`), the pool's size and that backend's own settings."""
    job: JobConfig = JobConfig()
    """The training job's limits."""
    image: ImageConfig = ImageConfig()
    """The training image: Dockerfile flavour, base, registry and credentials."""
    fileserver_export: Path | None = None
    """The file server's export folder (on Azure: where the NFS share is mounted); unset: <workdir>/fileserver."""
    tracking: TrackingConfig = TrackingConfig()
    """Experiment tracking in MLflow: the store (unset: SQLite under the workdir) and the experiment."""
    cost: CostConfig = CostConfig()
    """The price table of the cost ledger and the budget (per VM size, dedicated and low-priority)."""
    budget: float | None = Field(None, ge=0)
    """The most a run's training may cost, in cost.currency: a run whose estimate (infra/runs/ledger.py: a measured
    earlier run with the same settings, else nodes x price x job.timeout_s x attempts) is higher is refused before
    anything starts; unset: no limit."""

    @model_validator(mode="before")
    @classmethod
    def _no_backend_sections(cls, values):
        # the format before each backend's settings moved into its pool section: one line saying where they went
        # (defined before _no_secrets, so it runs after it: pydantic runs "before" validators last-defined first)
        if isinstance(values, dict):
            refuse_backend_sections(values)
        return values

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, values):
        # before every other check, so none quotes a secret: Prefect stores the whole config with every run
        if isinstance(values, dict):
            refuse_secrets(values, cls)
        return values

    @model_validator(mode="after")
    def _the_backend_can_run_it(self) -> "FlowConfig":
        backend_of(self.pool).check(self)
        return self

    @model_validator(mode="after")
    def _init_from_is_a_model_file(self) -> "FlowConfig":
        # a run id becomes its model file's path, which the trainer reads where the workers can
        given = weights_file(self.training.init_from, self.workdir / "runs")
        if given != self.training.init_from:  # only then: a setting assigned counts as one the user set
            self.training.init_from = given
        check_weights(given, self.training.framework)
        backend = backend_of(self.pool)
        if given and given != IMAGENET and not backend.reads_local_files:
            raise ValueError(
                f"training.init_from {given}: the {backend.name} pool's workers cannot read this machine's files; "
                "fine-tune on the process pool (pool.backend: process), or start from imagenet"
            )
        return self

    @model_validator(mode="after")
    def _script_can_run(self) -> "FlowConfig":
        # the script section checked itself; here what it needs of the rest: data for ${{data}}, the process pool
        if self.script is None:
            return self
        if self.data is None:  # a script's data is only what --data names
            self.data = SYNTHETIC
        if self.max_side:
            raise ValueError(
                "max_side shrinks the images trainflow's trainer reads; a script reads its data as it is: leave "
                "max_side unset (or shrink the images yourself)"
            )
        try:
            check_placeholders(self.script, self.data)
        except BadInput as exc:
            raise PydanticCustomError(SCRIPT_REFUSED, "{line}", {"line": str(exc)}) from None
        return self

    @field_validator("max_side")
    @classmethod
    def _max_side_is_a_size(cls, value):
        return value if value is None else check_max_side(value)

    @field_validator("dataset")
    @classmethod
    def _dataset_is_a_name(cls, value):
        # before anything starts: the name is a folder under cache/ and the file server, and a blob prefix
        try:
            return value if value is None else check_dataset_name(value)
        except UsageError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _staged_data_is_named(self) -> "FlowConfig":
        if self.data == STAGED and not self.dataset:
            raise ValueError(
                "data: staged trains on a data set already in Blob storage; name it with dataset: NAME "
                "(TRAINFLOW_DATASET=NAME)"
            )
        return self

    def image_requirements(self) -> list[str]:
        """What the run's program needs in its image beyond the framework's: a script's requirements.txt (none for
        trainflow's trainer, which its image is made for)."""
        return [str(r) for r in requirements_of(self.script.source)] if self.script else []

    def dataset_name(self) -> str:
        """The data set's name: synthetic, configured, else the data folder's name, lowercased to [a-z0-9-]."""
        if self.data == SYNTHETIC:
            return SYNTHETIC
        if self.dataset:
            return self.dataset
        base = re.sub(r"[^a-z0-9-]+", "-", Path(self.data or "digits").name.lower()).strip("-")
        return base or "dataset"

    def data_layout(self) -> str:
        """How the data folder is laid out, as the program reads it: the ImageNet layout (trainflow's trainer), or any
        files (a user's script)."""
        return FILES_LAYOUT if self.script else IMAGENET_LAYOUT

    def export_dir(self) -> Path:
        """The file server's export folder."""
        return self.fileserver_export or self.workdir / "fileserver"


def smoke_config(cfg: FlowConfig) -> FlowConfig:
    """`cfg` cut down to 1 node x 1 worker and about a minute of training: the run that checks a deployment."""
    values = cfg.model_dump()
    values["pool"].update(nodes=1, slots_per_node=1)
    values["training"].update(workers=1, epochs=1, steps_per_epoch=100, checkpoint_every=50, log_every=10)
    values["job"].update(timeout_s=1800)
    return FlowConfig.model_validate(values)


def load_config(path: Path | None, overrides: dict, environ: Mapping[str, str] | None = None) -> FlowConfig:
    """Merge defaults, the YAML file, TRAINFLOW_* variables and `overrides` (nested dicts) and validate. A run's
    command reads its config through flows/recipes.py's `load_with_recipe`, which fills what it leaves out with the
    recipe that fits its data."""
    return validated(merged_values(path, overrides, environ), path)


def merged_values(path: Path | None, overrides: dict, environ: Mapping[str, str] | None = None) -> dict:
    """The settings of the YAML file, TRAINFLOW_* variables and `overrides` (nested dicts), each over the one
    before, not yet validated."""
    values = checked_sections(read_yaml(path), f"config file {path}") if path else {}
    env = env_values(os.environ if environ is None else environ)
    values = deep_merge(values, checked_sections(env, FROM_ENV))
    return deep_merge(values, checked_sections(overrides, "the command-line options"))


def validated(values: dict, path: Path | None) -> FlowConfig:
    """The FlowConfig of merged settings, or a ConfigError naming each invalid one (and the file they may be from)."""
    try:
        return FlowConfig.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(describe(exc, path)) from None


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last one silently, so one
    of the two settings would be dropped without a word)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"{key} is set twice (first on line {seen[key] + 1}); keep one of the two",
                    key_node.start_mark,
                )
            seen.setdefault(key, key_node.start_mark.line)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> dict:
    """A YAML mapping from `path`, or a ConfigError that says what is wrong with the file and where."""
    try:
        loaded = yaml.load(path.read_text(), Loader=UniqueKeyLoader)  # a SafeLoader: builds plain data only
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path} ({exc.strerror}); check the --config path") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML{yaml_problem(exc)}") from None
    if loaded is None:
        raise ConfigError(
            f"config file {path} is empty (it holds no settings, only blank lines or comments); write settings "
            "in it such as `training: {epochs: 3}`, or leave out --config"
        )
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping such as `training: {{epochs: 3}}`")
    return loaded


def yaml_problem(exc: yaml.YAMLError) -> str:
    """ " at line L, column C: what is wrong (while ..., from line L, column C)", counting from 1 as editors do."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or first_line(exc)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start and start is not mark:
        problem += f" ({context} from line {start.line + 1}, column {start.column + 1})"
    return f"{at}: {problem}"


FROM_ENV = "TRAINFLOW_* variables"


# The project's TRAINFLOW_ variables that are not settings, never read as config: where the fast loader's compiled
# library is kept (containers/trainer/jpeg_crop.py), the images' trainer (containers/*.Dockerfile), the checkout a
# deployment pulls (prefect.yaml), and the test suite's own (tests/conftest.py).
OTHER_VARIABLES = frozenset(
    {
        "TRAINFLOW_JPEG_CROP_DIR",
        "TRAINFLOW_TRAINER",
        "TRAINFLOW_REPO",
        "TRAINFLOW_TEST_FREE_GIB",
        "TRAINFLOW_TEST_REGISTRY",
    }
)


def env_values(environ: Mapping[str, str]) -> dict:
    """TRAINFLOW_SECTION__FIELD=value as nested dicts (values stay strings; pydantic converts them); a TRAINFLOW_
    variable that names no setting (and is not one of the project's OTHER_VARIABLES) is a ConfigError naming it and
    the nearest setting's variable."""
    values: dict = {}
    keys = setting_variables_in(environ)
    for key in keys:  # a parent sorts before its children
        *parents, leaf = key[len(ENV_PREFIX) :].lower().split("__")
        node = values
        for depth, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"environment variables {env_name(parents[: depth + 1])} and {key} conflict: the "
                    f"first sets {'.'.join(parents[: depth + 1])} to one value, the second a setting "
                    "inside it; unset one of them"
                )
        if isinstance(node.get(leaf), dict):
            raise ConfigError(
                f"environment variable {key} sets {'.'.join([*parents, leaf])}, which other TRAINFLOW_ "
                "variables fill setting by setting; unset it"
            )
        node[leaf] = environ[key]
    refuse_unknown(keys)
    return values


def setting_variables_in(environ: Mapping[str, str]) -> list[str]:
    """The TRAINFLOW_ variables of `environ` that the config reads (the project's OTHER_VARIABLES are not settings)."""
    return sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in OTHER_VARIABLES)


def refuse_unknown(keys: list[str]) -> None:
    """A ConfigError for the first TRAINFLOW_ variable that names no setting, with the one it most likely meant."""
    known = setting_variables()
    old_sections = tuple(f"{ENV_PREFIX}{name.upper()}__" for name in BACKENDS)  # refuse_backend_sections names them
    if unknown := [k for k in keys if k.upper() not in known and not k.upper().startswith(old_sections)]:
        nearest = nearest_variable(unknown[0].upper(), known)
        hint = f"did you mean {nearest}?" if nearest else "see the settings reference (docs/reference/settings.md)"
        raise ConfigError(f"environment variable {unknown[0]} names no setting; {hint} Unset it or rename it")


def nearest_variable(key: str, known: set[str]) -> str | None:
    """The setting variable `key` most likely meant: one whose last part it names (TRAINFLOW_EPOCHS: the section
    left out), else the closest spelling."""
    leaf = key.rsplit("__", 1)[-1].removeprefix(ENV_PREFIX)
    same_leaf = sorted(k for k in known if k.rsplit("__", 1)[-1].removeprefix(ENV_PREFIX) == leaf)
    nearest = same_leaf or difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return nearest[0] if nearest else None


def setting_variables(model: type[BaseModel] | None = None, where: tuple = ()) -> set[str]:
    """The TRAINFLOW_ variable of every setting and section (every framework's and backend's)."""
    names = set()
    for name, field in (model or FlowConfig).model_fields.items():
        path = (*where, name)
        names.add(env_name(path))
        for kind in one_of_sections(field) or [field.annotation]:
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                names |= setting_variables(kind, path)
    return names


def env_name(where) -> str:
    """The TRAINFLOW_* variable of a setting's path (training, epochs -> TRAINFLOW_TRAINING__EPOCHS)."""
    return ENV_PREFIX + "__".join(where).upper()


def deep_merge(base: dict, top: dict) -> dict:
    """`top` over `base`, merging nested mappings; None in `top` leaves `base` as it is."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key) or {}, dict):
            merged[key] = deep_merge(merged.get(key) or {}, value)
        elif value is not None:
            merged[key] = value
    return merged


def section_type(field) -> type[BaseModel] | None:
    """The model of a setting that is a section of settings (training, storage, ...), else None; for a section that
    is one of several (pool: the section of the backend it names), the model they all derive from (not a plain
    class they share, such as the trainers' options declaration)."""
    kinds = one_of_sections(field) or [field.annotation]
    if not all(isinstance(kind, type) and issubclass(kind, BaseModel) for kind in kinds):
        return None
    return next(
        base
        for base in kinds[0].__mro__
        if issubclass(base, BaseModel) and all(issubclass(kind, base) for kind in kinds)
    )


def one_of_sections(field) -> list:
    """The types of a setting that is one of several (a union, its members unwrapped from Annotated), else []."""
    if get_origin(field.annotation) not in (Union, types.UnionType):
        return []
    kinds = [kind for kind in get_args(field.annotation) if kind is not type(None)]  # an optional section: its own
    return [get_args(kind)[0] if get_origin(kind) is Annotated else kind for kind in kinds]


def checked_sections(values: dict, source: str, model: type[BaseModel] | None = None, where: tuple = ()) -> dict:
    """`values` with empty (null) sections left out; a ConfigError for a section given as anything but a mapping,
    which merging would otherwise replace with the defaults or another source's mapping."""
    checked = dict(values)
    for name, field in (model or FlowConfig).model_fields.items():
        section = section_type(field)
        if section is None or name not in checked:
            continue
        if checked[name] is None:
            del checked[name]  # `training:` with nothing under it, or an option left unset
        elif isinstance(checked[name], dict):
            checked[name] = checked_sections(checked[name], source, section, (*where, name))
        else:
            raise not_a_section((*where, name), checked[name], source)
    return checked


def not_a_section(where: tuple, value, source: str) -> ConfigError:
    """The error for a section given a single value (never shown: it may be a secret)."""
    dotted = ".".join(where)
    kind = {bool: "true or false", int: "a number", float: "a number", str: "a string", list: "a list"}.get(
        type(value), type(value).__name__
    )
    if source == FROM_ENV:
        origin, fix = (
            f"environment variable {env_name(where)}",
            (f"unset {env_name(where)} and set each setting as {env_name(where)}__<SETTING>=<value>"),
        )
    elif source.startswith("config file"):
        origin, fix = (
            source,
            f"write them as a mapping ({where[-1]}: {{<setting>: <value>}}, or indented lines below {where[-1]}:)",
        )
    else:
        origin, fix = source, "pass them as a mapping"
    return ConfigError(f"{dotted} from {origin} is {kind}, but {dotted} is a section of settings: {fix}")


def secret_homes(model: type[BaseModel], prefix: str = "") -> list[str]:
    """The settings (dotted) that name an environment variable holding a secret."""
    homes = []
    for name, field in model.model_fields.items():
        if names_a_variable(field):
            homes.append(prefix + name)
        elif section := section_type(field):
            homes += secret_homes(section, f"{prefix}{name}.")
    return homes


def secrets_in(value, model: type[BaseModel] | None = None, where: str = ""):
    """(setting, kinds of secret) for every text under `value` that holds something secret-shaped; a setting that
    names a variable is left to its own check, which refuses anything but a name."""
    if isinstance(value, BaseModel):
        value, model = value.model_dump(mode="json"), type(value)
    if isinstance(value, dict):
        for key, item in value.items():
            field = model.model_fields.get(key) if model else None
            if field is None or not names_a_variable(field):
                yield from secrets_in(
                    item, section_type(field) if field else None, f"{where}.{key}" if where else str(key)
                )
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from secrets_in(item, None, f"{where}[{i}]")
    elif isinstance(value, (str, os.PathLike)) and (shapes := secret_shapes(str(value))):
        yield where, shapes


def refuse_secrets(values: dict, model: type[BaseModel]) -> None:
    """A ValueError naming each setting that holds something secret-shaped, and the settings where it belongs."""
    homes = secret_homes(model)
    problems = []
    for where, shapes in secrets_in(values, model):
        near = [h for h in homes if h.split(".")[0] == where.split(".")[0]] or homes
        problems.append(
            f"{where} holds what looks like {shapes[0]}, and the config is stored with every run: put "
            f"the secret in an environment variable and name it in {either(near)}; the value given "
            "is not shown"
        )
    if problems:
        raise ValueError("; ".join(problems))


def either(names: list[str]) -> str:
    """ "a", "a or b", "a, b or c"."""
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def default_at(loc: tuple) -> Any:
    """The default of the setting at a pydantic error location in FlowConfig (None when there is none)."""
    model: type[BaseModel] | None = FlowConfig
    field = None
    for part in loc:
        field = model.model_fields.get(part) if model else None
        if field is None:
            return None
        model = section_type(field)
    return field.default if field else None


def describe(exc: ValidationError, path: Path | None) -> str:
    """One line naming each invalid setting, its value unless it may be a secret, and what is allowed."""
    source = f" (from {path}, TRAINFLOW_* variables or options)" if path else ""
    return "; ".join(explain(err) for err in either_type([as_setting(err) for err in exc.errors()])) + source


def either_type(errors: list[dict]) -> list[dict]:
    """The errors with those of one setting that takes one of several types (training.loader_workers: a number or
    auto), which pydantic gives once for each type, as one: "Input should be a valid integer or 'auto'"."""
    grouped: dict[tuple, list[dict]] = {}
    for err in errors:
        grouped.setdefault(tuple(err["loc"]), []).append(err)
    merged = []
    for group in grouped.values():
        if len(group) > 1 and all(err["msg"].startswith(SHOULD) for err in group):
            allowed = [WHY.sub("", err["msg"]).removeprefix(SHOULD) for err in group]
            group = [{**group[0], "msg": SHOULD + " or ".join(allowed)}]
        merged += group
    return merged


SHOULD = "Input should be "  # how pydantic's errors of a value's type begin
WHY = re.compile(r", unable to .*$")  # after it, why the value is not of that type ("unable to parse string as ...")


def as_setting(err: Mapping[str, Any]) -> dict:
    """A pydantic error as one about a setting: its location without the tag that picks a section of several
    (pool.azureml.max_nodes is pool.max_nodes), and a tag no section has as the value of the setting that names it
    (pool.backend = 'slurm')."""
    found = {**err, "loc": setting_path(err["loc"])}
    named = found.get("ctx", {}).get("discriminator", "")
    if found["type"] != "union_tag_invalid" or not named.startswith("'"):  # a callable picks: no setting to name
        return found
    message = f"Input should be {either(found['ctx']['expected_tags'].split(', '))}"
    where, tag = (*found["loc"], named.strip("'")), found["ctx"]["tag"]
    return {**found, "type": "literal_error", "loc": where, "input": tag, "msg": message}


def setting_path(loc: tuple) -> tuple:
    """A pydantic error location in FlowConfig without the tags pydantic adds after a section that is one of several."""
    model: type[BaseModel] | None = FlowConfig
    path, parts = [], list(loc)
    while parts:
        part = parts.pop(0)
        path.append(part)
        field = model.model_fields.get(part) if model and isinstance(part, str) else None
        if field is None:
            return (*path, *parts)
        kinds = one_of_sections(field)
        if kinds and not section_type(field) and type(None) not in kinds:
            return tuple(path)  # a value of one of several types: what follows names the type it was tried as
        model = section_type(field)
        if kinds and parts:
            parts.pop(0)  # the tag; a setting that only some of the sections have is found in theirs
            model = next((kind for kind in kinds if parts and parts[0] in kind.model_fields), model)
    return tuple(path)


def explain(err: Mapping[str, Any]) -> str:
    """One invalid setting: where it is, its value (unless it may be a secret), what is wrong."""
    where = ".".join(str(p) for p in err["loc"])
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == SCRIPT_REFUSED:  # the script's own problem, in its own words (a file, a line, an entry)
        return message
    if not where or (err["type"] == "value_error" and isinstance(err["input"], dict)):  # a rule across settings
        return f"invalid config: {message}"
    if err["type"] == ENV_NAME_ERROR:
        example = default_at(err["loc"]) or "MY_SECRET"
        return (
            f"{where} must name an environment variable such as {example}, not hold its value; the value given "
            "is not shown"
        )
    value = err["input"]  # a secret-shaped one never gets here (_no_secrets), and ConfigError masks any part left
    # an unknown key's value is not shown (it may be a secret set under the wrong name), nor a whole section
    shown = err["type"] not in ("missing", "extra_forbidden") and not isinstance(value, dict)
    return f"invalid setting {where}{f' = {value!r}' if shown else ''}: {message}"
