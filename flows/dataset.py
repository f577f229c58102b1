"""The data a command trains on: the folder the config names, 'synthetic', 'staged', or the digits set (written
once under the workdir), its file names checked before any service starts. The commands and the benchmarks
resolve it here."""

from pathlib import Path

from flows.config import LOCAL_DATA_FREE, ConfigError, FlowConfig
from infra.data.manifest import check_names, relative_paths
from infra.data.sample_data import write_digits


def with_data(cfg: FlowConfig) -> FlowConfig:
    """`cfg` with its data resolved (the digits set written once when none is named), its names checked: bad data
    fails here, before any service starts."""
    cfg = cfg.model_copy(update={"data": data_folder(cfg)})
    check_data_names(cfg)
    return cfg


def data_folder(cfg: FlowConfig) -> str:
    """The data to train on: the configured folder, 'synthetic', 'staged', or the digits set (written once)."""
    if cfg.data:
        return cfg.data if cfg.data in LOCAL_DATA_FREE else str(Path(cfg.data).resolve())
    return str(digits_at(cfg.workdir / "data" / "digits"))


def digits_at(dest: Path) -> Path:
    """The digits set at `dest`, written there once."""
    try:
        return write_digits(dest.resolve())
    except OSError as exc:
        raise ConfigError(
            f"cannot write the digits set to {dest} ({exc.strerror}); pass a writable --workdir or --data"
        ) from None


def check_data_names(cfg: FlowConfig) -> None:
    """Refuse a local data folder whose file names cannot be staged (nothing to check for staged or synthetic data)."""
    if cfg.data and cfg.data not in LOCAL_DATA_FREE:
        check_names(relative_paths(Path(cfg.data)))
