"""`trainflow data`: small real data sets written to disk (the digits set, an ImageNet-shaped set) and the rewrite of
a data set's JPEGs with restart markers for the fast loader."""

from pathlib import Path
from typing import Annotated

import typer

from cli.common import ConfigOpt, WorkdirOpt, configure, data_option, friendly_errors
from flows.config import LOCAL_DATA_FREE, ConfigError
from flows.dataset import digits_at

data_app = typer.Typer(help="Small real data sets, written to disk.", no_args_is_help=True)

DigitsDataOpt = Annotated[
    str | None, data_option("the config's data, else WORKDIR/data/digits", what="Folder to write the digits set to")
]
ShapedDataOpt = Annotated[
    str | None,
    data_option(
        "the config's data, else WORKDIR/data/imagenet-shaped-CLASSESxPER_CLASS+VAL_PER_CLASS",
        what="Folder to write the set to",
    ),
]
MarkersDataOpt = Annotated[
    str | None,
    typer.Option(
        "--data",
        help="ImageNet-layout folder whose train/ JPEGs to rewrite; required, here or as the config's data.",
        show_default=False,
    ),
]


@data_app.command("digits")
@friendly_errors
def digits(config: ConfigOpt = None, data: DigitsDataOpt = None, workdir: WorkdirOpt = None) -> None:
    """Write scikit-learn's 8x8 digits as 32x32 PNGs in ImageNet layout (to --data, or under the workdir)."""
    cfg = configure(config, data, workdir)
    print(digits_at(Path(cfg.data) if cfg.data else cfg.workdir / "data" / "digits"))


@data_app.command("imagenet-shaped")
@friendly_errors
def imagenet_shaped(
    classes: Annotated[int, typer.Option(help="Class folders, named like ImageNet's (n01440764, ...).")] = 1000,
    per_class: Annotated[int, typer.Option(help="Training images per class.")] = 1281,
    val_per_class: Annotated[int, typer.Option(help="Validation images per class (0: no val/ folder).")] = 50,
    config: ConfigOpt = None,
    data: ShapedDataOpt = None,
    workdir: WorkdirOpt = None,
) -> None:
    """Write an ImageNet-shaped set of small, distinct JPEGs (default: ImageNet-1k's shape, 1,331,000 files, about
    5.5 GB on disk) to --data, or under the workdir; one already there with the same shape is kept."""
    from infra.data.sample_data import ImagenetShape, write_imagenet_shaped

    shape = ImagenetShape(classes, per_class, val_per_class)
    shape.check()  # before anything is created
    cfg = configure(config, data, workdir, recipe=False)
    dest = (Path(cfg.data) if cfg.data else cfg.workdir / "data" / f"imagenet-shaped-{shape.label}").resolve()
    try:
        done = write_imagenet_shaped(dest, *shape)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the ImageNet-shaped set to {dest} ({exc.strerror}); pass a writable --workdir or --data"
        ) from None
    size = f"{done['files']:,} files, {done['bytes'] / 1e6:,.2f} MB"
    if done["kept"]:
        print(f"kept {dest}: {size}, written before with this shape (delete it to write it again)")
    else:
        print(f"wrote {dest}: {size} in {done['seconds']:.1f} s ({done['files'] / done['seconds']:,.0f} files/s)")


@data_app.command("add-restart-markers")
@friendly_errors
def add_restart_markers(
    config: ConfigOpt = None,
    data: MarkersDataOpt = None,
    workdir: WorkdirOpt = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Processes (default: one per core).")] = None,
) -> None:
    """Rewrite the training JPEGs of --data in place with a restart marker after every MCU: lossless (each checked to
    decode to the same pixels), so the fast loader decodes only each random crop's MCUs. Run once before staging;
    a second run rewrites only what the first did not reach."""
    from infra.data.restart_markers import add_restart_markers as rewrite

    cfg = configure(config, data, workdir, recipe=False)
    if not cfg.data or cfg.data in LOCAL_DATA_FREE:
        raise ConfigError(
            "add-restart-markers needs --data DIR: the ImageNet-layout folder whose train/ JPEGs to rewrite"
        )
    done = rewrite(Path(cfg.data).resolve(), workers)
    print_restarts_summary(done)


def print_restarts_summary(done: dict) -> None:
    """What add-restart-markers did: counts, sizes, time; the JPEGs left as they were (the first 20), with why."""
    from infra.data.restart_markers import ALREADY, LEFT, NOT_JPEG, REWRITTEN

    seconds = max(done["seconds"], 1e-9)
    print(
        f"{done['folder']}/train: {done['files']:,} images in {seconds:.1f} s ({done['files'] / seconds:,.0f} "
        f"files/s): {done[REWRITTEN]:,} {REWRITTEN}, {done[ALREADY]:,} {ALREADY}, {done[LEFT]:,} JPEGs "
        f"{LEFT}, {done[NOT_JPEG]:,} {NOT_JPEG}; {done['bytes_before'] / 1e6:,.1f} MB -> "
        f"{done['bytes_after'] / 1e6:,.1f} MB"
    )
    if done["files"] == done[NOT_JPEG]:
        print("  no JPEGs to rewrite: the fast loader's partial decoding is for JPEGs")
    if done["leftovers_removed"]:
        print(f"  removed {done['leftovers_removed']:,} temporary files an interrupted run had left")
    for path, why in done["left"][:20]:
        print(f"  left as it was: {path} ({why})")
    if len(done["left"]) > 20:
        print(f"  ... and {len(done['left']) - 20:,} more left as they were")
