"""FlowConfig: the one typed configuration, from a YAML file, the environment and the command line.

Precedence, highest first: command-line options, TRAINFLOW_* environment variables
(TRAINFLOW_TRAINING__EPOCHS=3 sets training.epochs), the --config file, the defaults.
Each section lives next to the code that owns it.
"""

import os
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, create_model, model_validator

from infra.backends import JobConfig, PoolConfig, backend_of, backend_sections
from infra.blobstore import StorageConfig
from infra.errors import BadInput
from infra.fileshare import FileShareConfig
from infra.images import ImageConfig
from infra.sample_data import DIGITS_TRAINING
from infra.trainer import SYNTHETIC, TrainingConfig

ENV_PREFIX = "TRAINFLOW_"
STAGED = "staged"  # data: train on the data set already in Blob storage under `dataset`
LOCAL_DATA_FREE = (SYNTHETIC, STAGED)  # values of `data` that name no local folder


class ConfigError(BadInput):
    """A config file or option that cannot be used; the message names the setting and the fix."""


class FlowSettings(BaseModel):
    """Everything one run of the flow needs; each compute backend with settings of its own adds its section."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    workdir: Path = Path(".trainflow")
    """Root of all local state: data, file share, file server, storage emulator data, results."""
    data: str | None = None
    """ImageNet-layout folder; "synthetic"; "staged": the data set already in Blob under `dataset`, nothing
    uploaded (scheduled runs on a machine without the local copy); unset: the small digits set, written under
    workdir on first use, with training defaults that fit it (a run of minutes; see infra/sample_data.py)."""
    dataset: str | None = None
    """Name of the data set in Blob and on the file server; unset: the data folder's name."""
    training: TrainingConfig = TrainingConfig()
    """How the trainer runs (every option of containers/trainer/train.py, the launcher and the workers)."""
    storage: StorageConfig = StorageConfig()
    """Blob storage for the data set."""
    fileshare: FileShareConfig = FileShareConfig()
    """The file share for the training scripts."""
    pool: PoolConfig = PoolConfig()
    """Where the workers run: the compute backend and its size."""
    job: JobConfig = JobConfig()
    """The training job's limits."""
    image: ImageConfig = ImageConfig()
    """The training image: Dockerfile flavour, base, registry and credentials."""
    fileserver_export: Path | None = None
    """The file server's export folder (on Azure: where the NFS share is mounted); unset: <workdir>/fileserver."""

    @model_validator(mode="after")
    def _the_backend_can_run_it(self) -> "FlowSettings":
        backend_of(self.pool).check(self)
        return self

    @model_validator(mode="after")
    def _staged_data_is_named(self) -> "FlowSettings":
        if self.data == STAGED and not self.dataset:
            raise ValueError("data: staged trains on a data set already in Blob storage; name it with dataset: NAME "
                             "(TRAINFLOW_DATASET=NAME)")
        return self

    def dataset_name(self) -> str:
        """The data set's name: synthetic, configured, else the data folder's name, lowercased to [a-z0-9-]."""
        if self.data == SYNTHETIC:
            return SYNTHETIC
        if self.dataset:
            return self.dataset
        base = re.sub(r"[^a-z0-9-]+", "-", Path(self.data or "digits").name.lower()).strip("-")
        return base or "dataset"

    def export_dir(self) -> Path:
        """The file server's export folder."""
        return self.fileserver_export or self.workdir / "fileserver"


FlowConfig = create_model("FlowConfig", __base__=FlowSettings, __module__=__name__, **backend_sections())
FlowConfig.__doc__ = FlowSettings.__doc__


def smoke_config(cfg: FlowConfig) -> FlowConfig:
    """`cfg` cut down to 1 node x 1 worker and about a minute of training: the run that checks a deployment."""
    values = cfg.model_dump()
    values["pool"].update(nodes=1, slots_per_node=1)
    values["training"].update(workers=1, epochs=1, steps_per_epoch=100, checkpoint_every=50, log_every=10)
    values["job"].update(timeout_s=1800)
    return FlowConfig.model_validate(values)


def load_config(path: Path | None, overrides: dict, environ: dict[str, str] | None = None,
                digits_defaults: bool = False) -> FlowConfig:
    """Merge defaults, the YAML file, TRAINFLOW_* variables and `overrides` (nested dicts) and validate.

    With `digits_defaults`, a config that names neither data (so trains on the built-in digits set) nor a model
    gets the training defaults that fit that set (a run of minutes, not ResNet-50's 90 epochs at 224 px), under
    its own settings; a config that names its model keeps the reference defaults for everything it leaves out."""
    values = deep_merge(read_yaml(path) if path else {}, env_values(os.environ if environ is None else environ))
    values = deep_merge(values, overrides)
    training = values.get("training") or {}
    if digits_defaults and values.get("data") is None and isinstance(training, dict) and "model" not in training:
        values["training"] = deep_merge(DIGITS_TRAINING, training)
    try:
        return FlowConfig.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(describe(exc, path)) from None


def read_yaml(path: Path) -> dict:
    """A YAML mapping from `path`, or a ConfigError that says what is wrong with the file."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path} ({exc.strerror}); check the --config path") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping such as `training: {{epochs: 3}}`")
    return loaded


def env_values(environ: dict[str, str]) -> dict:
    """TRAINFLOW_SECTION__FIELD=value as nested dicts (values stay strings; pydantic converts them)."""
    values: dict = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX):
            *parents, leaf = key[len(ENV_PREFIX):].lower().split("__")
            node = values
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    return values


def deep_merge(base: dict, top: dict) -> dict:
    """`top` over `base`, merging nested mappings; None in `top` leaves `base` as it is."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key) or {}, dict):
            merged[key] = deep_merge(merged.get(key) or {}, value)
        elif value is not None:
            merged[key] = value
    return merged


def describe(exc: ValidationError, path: Path | None) -> str:
    """One line per invalid setting: where it is, its value, what is allowed."""
    source = f" (from {path}, TRAINFLOW_* variables or options)" if path else ""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        if not where or (err["type"] == "value_error" and isinstance(err["input"], dict)):  # a rule across settings:
            lines.append(f"invalid config: {err['msg'].removeprefix('Value error, ')}")
            continue
        # an unknown key's value is not shown (it may be a secret set under the wrong name), nor a whole section
        shown = err["type"] not in ("missing", "extra_forbidden") and not isinstance(err["input"], dict)
        given = f" = {err['input']!r}" if shown else ""
        lines.append(f"invalid setting {where}{given}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines) + source
