"""`trainflow bench`: a command for each benchmark of benchmarks/. Each is declared below by a function whose
signature is the command's options and whose docstring is its help; `bench` makes the command, which reads the
config and runs the benchmark's own function (BENCHES names it) with the config, --json and the other options."""

import functools
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from pkgutil import resolve_name
from typing import Annotated, Any

import typer

from benchmarks import BENCHES, REPEATS
from cli.common import ConfigOpt, DataOpt, WorkdirOpt, configure, data_option, friendly_errors
from cli.services import holding
from flows.config import ConfigError

bench_app = typer.Typer(help="Benchmarks that print numbers.", no_args_is_help=True)

JsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")]
# --data of the benchmarks that make their own data without it (`DataOpt`, the config's data else the digits set, is
# bench flow's)
SyntheticDataOpt = Annotated[
    str | None, data_option("the config's data, else synthetic (one random batch, no files read)")
]
StagedDataOpt = Annotated[
    str | None,
    data_option(
        "the config's data, else a generated folder of --files photo-like JPEGs (under WORKDIR/bench/staging)",
        what="ImageNet-layout folder to stage",
    ),
]
LoaderDataOpt = Annotated[
    str | None,
    data_option(
        "the config's data, else --files generated photo-like JPEGs (under WORKDIR/bench/loader)",
        what="ImageNet-layout folder whose train/ images the loaders read",
    ),
]
RepeatsOpt = Annotated[int, typer.Option(min=2, help="Rounds of every configuration (figures: median, min-max).")]
Declared = Callable[..., None]
READ_HERE = ("config", "data", "workdir", "json_out")  # the options the command reads; the rest go to the benchmark


def bench(name: str, holds: bool = True, recipe: bool = False) -> Callable[[Declared], Declared]:
    """Make the declared function the command `trainflow bench NAME`. Its body runs first: checks of the options
    alone, before anything is read or written. Then the command reads the config (with the recipe that fits its data,
    flows/recipes.py, only when `recipe`), holds the workdir when `holds` (`holding`, without Prefect) and runs the
    benchmark's function with the config, --json and the other options by name."""

    def register(declared: Declared) -> Declared:
        @bench_app.command(name)
        @friendly_errors
        @functools.wraps(declared)
        def command(**given: Any) -> None:
            declared(**given)
            cfg = configure(given["config"], given.get("data"), given["workdir"], recipe=recipe)
            with holding(cfg, prefect=False) if holds else nullcontext():
                options = {key: value for key, value in given.items() if key not in READ_HERE}
                resolve_name(BENCHES[name])(cfg, given["json_out"], **options)

        return command

    return register


@bench("train", holds=False)
def bench_train(
    config: ConfigOpt = None,
    data: SyntheticDataOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    launchers: Annotated[
        list[str], typer.Option("--launcher", help="Launchers to compare: horovodrun, torchrun (repeat the option).")
    ] = ["horovodrun", "torchrun"],  # noqa: B006 - typer's default, never mutated
    repeats: RepeatsOpt = REPEATS,
    frameworks: Annotated[
        list[str],
        typer.Option(
            "--framework",
            help="Frameworks to compare: pytorch, tensorflow, keras (repeat the option; the last two under "
            "horovodrun only); default: the config's training.framework.",
        ),
    ] = [],  # noqa: B006 - typer's default, never mutated
) -> None:
    """Throughput with 1 and 2 workers under Horovod and DDP, per framework, and the scaling efficiency."""


@bench("frameworks", holds=False)
def bench_frameworks(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    frameworks: Annotated[
        list[str],
        typer.Option("--framework", help="Frameworks to compare (repeat the option); default: every one."),
    ] = [],  # noqa: B006 - typer's default, never mutated
    repeats: RepeatsOpt = REPEATS,
) -> None:
    """Synthetic ResNet-50 images/s of each framework's trainer, one process each, side by side."""


@bench("staging")
def bench_staging(
    config: ConfigOpt = None,
    data: StagedDataOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    files: Annotated[int, typer.Option(min=1, help="Images in the generated ImageNet-like folder.")] = 5000,
    classes: Annotated[int, typer.Option(min=1, help="Classes in it.")] = 100,
) -> None:
    """Staging throughput: shards against one blob per file, and the cost of an unchanged re-run.

    Stages --data if given, else an ImageNet-like folder of --files JPEGs of about 110 KB.
    """


@bench("loader")
def bench_loader(
    config: ConfigOpt = None,
    data: LoaderDataOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    files: Annotated[int, typer.Option(min=1, help="JPEGs in the generated ImageNet-like folder.")] = 512,
    repeats: RepeatsOpt = REPEATS,
) -> None:
    """Images/s per core of each training loader (fast, pil, dali) on 1 core and on all; decode/augment/collate split.

    Reads --data's train/ if given, else --files photo-like JPEGs of ImageNet's sizes (quality 90, about 110 KB); every
    loader also reads them shrunk to a 500 px longer side.
    """


@bench("scale")
def bench_scale(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    sizes: Annotated[
        list[int], typer.Option("--files", min=100, help="Data set sizes (repeat the option); ImageNet is 1331167.")
    ] = [10_000, 100_000],  # noqa: B006 - typer's default, never mutated
) -> None:
    """Staging and training start-up as the data set grows: wall time, time per file and peak RSS of every stage.

    Each size is an ImageNet-shaped folder of small JPEGs (`trainflow data imagenet-shaped`), kept under the workdir.
    """


@bench("images")
def bench_images(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds of the unchanged rebuild, both ways.")] = 3,
    cold: Annotated[bool, typer.Option(help="Build the first image without the engine's layer cache.")] = False,
) -> None:
    """Training image: an unchanged rebuild and push against `docker build` (layer cache) + `docker push`, repeated."""


@bench("all")
def bench_all(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="The figures' JSON; the report (.md) and its plots (.svg) go beside it. Default: "
            "WORKDIR/bench/all.json.",
        ),
    ] = None,
    only: Annotated[list[str], typer.Option(help="Run only these benchmarks (repeat the option).")] = [],  # noqa: B006 - typer's default, never mutated
    size: Annotated[str, typer.Option(help="small (minutes each) or tiny (the size of their tests).")] = "small",
) -> None:
    """Every benchmark at a small size, one JSON and one markdown report with a plot per benchmark."""
    from benchmarks.suite import check_choices

    check_choices(tuple(only), size)


@bench("gpu")
def bench_gpu(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    loaders: Annotated[
        list[str],
        typer.Option(
            "--loader",
            help="Loaders to run on the JPEGs (repeat the option); default: every loader of the trainer installed "
            "here.",
        ),
    ] = [],  # noqa: B006 - typer's default, never mutated
    given_peak: Annotated[
        float | None,
        typer.Option("--peak-tflops", help="The GPU's peak dense bf16 TFLOP/s, for a GPU that the MFU table lacks."),
    ] = None,
    repeats: RepeatsOpt = REPEATS,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="Run the device check instead (`make device-check`): one round of its runs, within 8 minutes.",
        ),
    ] = False,
) -> None:
    """ResNet-50 bf16 images/s per GPU on synthetic data, photo-like JPEGs, shrunk JPEGs, data-wait share, MFU."""
    from benchmarks.gpu import check_loaders

    if quick and loaders:
        raise ConfigError("--quick runs the device check, which picks its own loaders: leave out --loader or --quick")
    check_loaders(loaders)


@bench("parallel", holds=False)
def bench_parallel(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    microbatches: Annotated[
        list[int], typer.Option(min=1, help="Micro-batch counts of the 2-stage pipeline (repeat the option).")
    ] = [1, 2, 4, 8],  # noqa: B006 - typer's default, never mutated
    repeats: RepeatsOpt = REPEATS,
) -> None:
    """Data-parallel (2 workers) against a 2-stage pipeline with 1, 2, 4, 8 micro-batches: images/s, memory, idle."""


@bench("install", holds=False)
def bench_install(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    repeats: RepeatsOpt = REPEATS,
    demo: Annotated[bool, typer.Option(help="Time `make demo` in a fresh clone, empty home, twice instead.")] = False,
    user: Annotated[str | None, typer.Option(help="Run the timed commands as this user (needs root).")] = None,
) -> None:
    """The venv's base layer installed from the lock by pip and by uv, every cache empty; or `make demo`."""


@bench("flow", recipe=True)  # each `trainflow run` it times starts its own services in a workdir of its own
def bench_flow(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    repeats: RepeatsOpt = REPEATS,
) -> None:
    """The same job directly (torchrun) and through the whole flow with every earlier step cached: the flow's \
overhead."""  # the backslash: one line in `trainflow bench --help`, as before


@bench("script")  # each `trainflow run --script` it times starts its own services in a workdir of its own
def bench_script(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: JsonOpt = None,
    repeats: RepeatsOpt = REPEATS,
    iterations: Annotated[int, typer.Option(min=1, help="The example's --iterations (each timed).")] = 10,
    batches_per_iter: Annotated[int, typer.Option(min=1, help="The example's --batches-per-iter.")] = 10,
    batch_size: Annotated[int, typer.Option(min=1, help="The example's --batch-size (per worker).")] = 32,
    image_size: Annotated[int, typer.Option(min=8, help="The example's --image-size.")] = 64,
    workers: Annotated[int, typer.Option(min=1, help="Workers of both launches.")] = 2,
) -> None:
    """Your own script (the Horovod synthetic example) through `trainflow run` and by hand: img/s, fixed \
overhead, the upload after a one-line edit."""
