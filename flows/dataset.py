"""The data a command trains on: the folder the config names, 'synthetic', 'staged', or the digits set (written
once under the workdir), its file names checked before any service starts. The commands and the benchmarks
resolve it here."""

from collections.abc import Iterable, Iterator
from pathlib import Path

from flows.config import LOCAL_DATA_FREE, ConfigError, FlowConfig
from infra.core.jsonfiles import read_json, write_json
from infra.data.manifest import check_names, relative_paths
from infra.data.sample_data import write_digits
from nodelib.errors import UsageError
from nodelib.layout import IMAGENET_LAYOUT


def with_data(cfg: FlowConfig, training: bool = False) -> FlowConfig:
    """`cfg` with its data resolved (the digits set written once when none is named), its names checked, and with
    `training` the batch checked against it: bad data fails here, before any service starts."""
    cfg = cfg.model_copy(update={"data": data_folder(cfg)})
    check_dataset_source(cfg)
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


def sources_file(cfg: FlowConfig) -> Path:
    """The record of the folder each data set name of the workdir was staged from (names taken from folders)."""
    return cfg.workdir / "cache" / "dataset-sources.json"


def named_after_folder(cfg: FlowConfig) -> bool:
    """Whether the data set takes its name from a local folder's (no `dataset:` set): two folders of one name would
    take the same one."""
    return bool(cfg.data) and cfg.data not in LOCAL_DATA_FREE and not cfg.dataset


def check_dataset_source(cfg: FlowConfig) -> None:
    """Refuse a folder that would replace the data set another folder of the same name staged in this workdir (one
    that still exists: a folder moved elsewhere is the same data)."""
    name = cfg.dataset_name()
    staged_from = read_json(sources_file(cfg)).get(name) if named_after_folder(cfg) else None
    if staged_from and staged_from != cfg.data and Path(staged_from).exists():
        raise ConfigError(
            f"data set {name!r} of workdir {cfg.workdir} was staged from {staged_from}; {cfg.data} has the same "
            f"folder name and would replace it: name this one with dataset: NAME (TRAINFLOW_DATASET=NAME), or use "
            "another --workdir"
        )


def remember_source(cfg: FlowConfig) -> None:
    """Record the folder a data set named after it was staged from (check_dataset_source reads it)."""
    if named_after_folder(cfg):
        write_json(sources_file(cfg), {**read_json(sources_file(cfg)), cfg.dataset_name(): str(cfg.data)})


def check_data_names(cfg: FlowConfig) -> int | None:
    """Refuse a local data folder whose file names cannot be staged; its training images, counted on the way (None
    for staged or synthetic data, which have nothing to check here, and for a script's files, which are not counted
    in images)."""
    if not cfg.data or cfg.data in LOCAL_DATA_FREE:
        return None
    train = 0

    def counted(paths: Iterable[str]) -> Iterator[str]:
        nonlocal train
        for path in paths:
            train += path.startswith("train/")
            yield path

    check_names(counted(relative_paths(Path(cfg.data), cfg.data_layout())))
    return train if cfg.data_layout() == IMAGENET_LAYOUT else None


def check_batch(cfg: FlowConfig, images: int | None) -> None:
    """Refuse a global batch larger than the training images, by the trainer's own rule (every replica needs a full
    batch each epoch), but before staging and the pool."""
    if images is not None:
        try:
            cfg.training.check_batch(images, str(cfg.data))
        except UsageError as exc:
            raise ConfigError(str(exc)) from None
