"""The data a command trains on: the folder the config names, 'synthetic', 'staged', or the digits set (written
once under the workdir), its file names checked before any service starts. The commands and the benchmarks
resolve it here."""

from collections.abc import Iterable, Iterator
from pathlib import Path

from flows.config import LOCAL_DATA_FREE, ConfigError, FlowConfig
from infra.data.manifest import check_names, relative_paths
from infra.data.sample_data import write_digits


def with_data(cfg: FlowConfig, training: bool = False) -> FlowConfig:
    """`cfg` with its data resolved (the digits set written once when none is named), its names checked, and with
    `training` the batch checked against it: bad data fails here, before any service starts."""
    cfg = cfg.model_copy(update={"data": data_folder(cfg)})
    images = check_data_names(cfg)
    if training:
        check_batch(cfg, images)
    return cfg


def data_folder(cfg: FlowConfig) -> str:
    """The data to train on: the configured folder, 'synthetic', 'staged', or the digits set (written once)."""
    if cfg.data:
        return cfg.data if cfg.data in LOCAL_DATA_FREE else str(Path(cfg.data).resolve())
    return str(digits_at(cfg.workdir / "data" / "digits"))


def shrunk_folder(cfg: FlowConfig) -> Path | None:
    """Where staging reads a data folder from with `max_side` set: its shrunk copy under the workdir, one per data
    set and size (infra/data/shrink.py); None when the images are staged as they are."""
    if cfg.max_side is None or not cfg.data or cfg.data in LOCAL_DATA_FREE:
        return None
    return cfg.workdir / "shrunk" / f"{cfg.dataset_name()}-{cfg.max_side}"


def digits_at(dest: Path) -> Path:
    """The digits set at `dest`, written there once."""
    try:
        return write_digits(dest.resolve())
    except OSError as exc:
        raise ConfigError(
            f"cannot write the digits set to {dest} ({exc.strerror}); pass a writable --workdir or --data"
        ) from None


def check_data_names(cfg: FlowConfig) -> int | None:
    """Refuse a local data folder whose file names cannot be staged; its training images, counted on the way (None
    for staged or synthetic data, which have nothing to check here)."""
    if not cfg.data or cfg.data in LOCAL_DATA_FREE:
        return None
    train = 0

    def counted(paths: Iterable[str]) -> Iterator[str]:
        nonlocal train
        for path in paths:
            train += path.startswith("train/")
            yield path

    check_names(counted(relative_paths(Path(cfg.data))))
    return train


def check_batch(cfg: FlowConfig, images: int | None) -> None:
    """Refuse a global batch larger than the training images (every worker needs a full batch each epoch), as the
    trainer's own preflight would, but before staging and the pool."""
    settings = cfg.training
    if images is not None and settings.batch_size * settings.workers > images:
        raise ConfigError(
            f"training.batch_size {settings.batch_size} x {settings.workers} workers is more than the {images} "
            f"training images in {cfg.data}; lower training.batch_size or training.workers"
        )
