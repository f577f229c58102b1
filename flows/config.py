"""PipelineConfig: the one typed configuration, from a YAML file, the environment and the command line.

Precedence, highest first: command-line options, TRAINFLOW_* environment variables
(TRAINFLOW_TRAINING__EPOCHS=3 sets training.epochs), the --config file, the defaults.
Each section lives next to the code that owns it.
"""

import os
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from infra.azureml import AzureMLConfig, check_complete, check_world
from infra.blobstore import StorageConfig
from infra.container_nodes import torchrun_layout
from infra.fileshare import FileShareConfig
from infra.images import ImageConfig
from infra.jobs import JobConfig
from infra.launcher import SYNTHETIC, TrainingConfig
from infra.pools import PoolConfig

ENV_PREFIX = "TRAINFLOW_"
STAGED = "staged"  # data: train on the data set already in Blob storage under `dataset`
LOCAL_DATA_FREE = (SYNTHETIC, STAGED)  # values of `data` that name no local folder


class ConfigError(Exception):
    """A config file or option that cannot be used; the message names the setting and the fix."""


class PipelineConfig(BaseModel):
    """Everything one pipeline run needs."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    workdir: Path = Path(".trainflow")
    """Root of all local state: data, file share, file server, storage emulator data, results."""
    data: str | None = None
    """ImageNet-layout folder; "synthetic"; "staged": the data set already in Blob under `dataset`, nothing
    uploaded (scheduled runs on a machine without the local copy); unset: the small digits set, written under
    workdir on first use."""
    dataset: str | None = None
    """Name of the data set in Blob and on the file server; unset: the data folder's name."""
    training: TrainingConfig = TrainingConfig()
    """How the training engine runs."""
    storage: StorageConfig = StorageConfig()
    """Blob storage for the data set."""
    fileshare: FileShareConfig = FileShareConfig()
    """The file share for the training scripts."""
    pool: PoolConfig = PoolConfig()
    """Where the workers run: local processes or container nodes."""
    job: JobConfig = JobConfig()
    """The training job's limits."""
    image: ImageConfig = ImageConfig()
    """The training image: Dockerfile flavour, base, registry and credentials."""
    azureml: AzureMLConfig = AzureMLConfig()
    """The Azure ML workspace and cluster (pool.backend azureml)."""
    fileserver_export: Path | None = None
    """The file server's export folder (on Azure: where the NFS share is mounted); unset: <workdir>/fileserver."""

    @model_validator(mode="after")
    def _pool_fits_the_launcher(self) -> "PipelineConfig":
        if self.pool.backend == "docker" and self.training.launcher == "torchrun":
            torchrun_layout(self.training.workers, self.pool.slots_per_node)
        if self.pool.backend == "azureml":
            check_world(self.pool, self.training.workers)
            check_complete(self.azureml, reads_nfs=self.azureml.data_source == "nfs" and self.data != SYNTHETIC)
        return self

    @model_validator(mode="after")
    def _staged_data_is_named(self) -> "PipelineConfig":
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


def smoke_config(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` cut down to 1 node x 1 worker and about a minute of training: the run that checks a deployment."""
    values = cfg.model_dump()
    values["pool"].update(nodes=1, slots_per_node=1)
    values["training"].update(workers=1, epochs=1, steps_per_epoch=100, checkpoint_every=50, log_every=10)
    values["job"].update(timeout_s=1800)
    return PipelineConfig.model_validate(values)


def load_config(path: Path | None, overrides: dict, environ: dict[str, str] | None = None) -> PipelineConfig:
    """Merge defaults, the YAML file, TRAINFLOW_* variables and `overrides` (nested dicts) and validate."""
    values = deep_merge(read_yaml(path) if path else {}, env_values(os.environ if environ is None else environ))
    values = deep_merge(values, overrides)
    try:
        return PipelineConfig.model_validate(values)
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
        if not where:  # a rule across sections: its message says which settings
            lines.append(f"invalid config: {err['msg'].removeprefix('Value error, ')}")
            continue
        # an unknown key's value is not shown (it may be a secret set under the wrong name), nor a whole section
        shown = err["type"] not in ("missing", "extra_forbidden") and not isinstance(err["input"], dict)
        given = f" = {err['input']!r}" if shown else ""
        lines.append(f"invalid setting {where}{given}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines) + source
