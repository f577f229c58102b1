"""The `trainflow` command line. Every command takes --config FILE, --data DIR and --workdir DIR."""

import functools
import json
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from flows.config import LOCAL_DATA_FREE, ConfigError, FlowConfig, load_config, smoke_config
from flows.interrupts import EXIT_INTERRUPTED, interrupted_line, stop_on_interrupt
from flows.preflight import check_access
from infra.compute import check_fits
from infra.compute.process import train_here
from infra.core.errors import exit_code
from infra.core.redact import RedactSecrets, redact
from infra.data.manifest import check_names, relative_paths
from infra.data.sample_data import write_digits
from infra.engines.contract import SYNTHETIC, TrainingMetrics
from infra.runs.ledger import check_budget
from infra.runs.tracking import UI_PORT, local_ui, store_folder, store_uri, ui_command
from infra.runs.workdir import check_workdir, command_line, workdir_lock
from infra.services.supervise import port_open

app = typer.Typer(
    help="Training of image classifiers on a cluster, end to end: data-parallel or pipeline-parallel.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
data_app = typer.Typer(help="Small real data sets, written to disk.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks that print numbers.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(bench_app, name="bench")
runs_app = typer.Typer(help="Past runs under the workdir: accuracy, time, cost, receipt.", invoke_without_command=True)
app.add_typer(runs_app, name="runs")
err = Console(stderr=True, highlight=False)

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="YAML config file (see flows/configs/).")]
DataOpt = Annotated[
    str | None, typer.Option("--data", help="ImageNet-layout folder or 'synthetic'; default: the digits set.")
]
WorkdirOpt = Annotated[Path | None, typer.Option("--workdir", help="Root of all local state (default .trainflow).")]
RepeatsOpt = Annotated[int, typer.Option(min=2, help="Rounds of every configuration (figures: median, min-max).")]
REPEATS = 3  # benchmarks.common.REPEATS, not imported here: benchmarks imports torch, which the CLI loads lazily


def friendly_errors(command):
    """Bad input and failed runs end in one line on stderr and a non-zero exit, not a traceback; an interrupt
    stops what the command started and ends in one line saying how to resume (flows/interrupts.py)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        with stop_on_interrupt(say):
            try:
                return command(*args, **kwargs)
            except KeyboardInterrupt as exc:
                say(interrupted_line(exc, command_line()))
                raise typer.Exit(EXIT_INTERRUPTED) from None
            except Exception as exc:
                code = exit_code(exc)
                if code is None:
                    raise
                say(f"error: {exc}")
                raise typer.Exit(code) from None

    return wrapper


def say(line: str) -> None:
    """A line for the user on stderr, secrets masked (the one redaction point, infra/core/redact.py)."""
    err.print(redact(line), markup=False, soft_wrap=True)


def configure(
    config: Path | None,
    data: str | None,
    workdir: Path | None,
    training: dict | None = None,
    digits_defaults: bool = True,
    **sections: dict,
) -> FlowConfig:
    """The validated config (file, environment, then these command-line overrides) with its workdir absolute and
    usable and, when no data is named, the training defaults that fit the digits set (`digits_defaults`). Every
    command reads its config here."""
    cfg = load_config(
        config,
        {"data": data, "workdir": workdir, "training": training or {}, **sections},
        digits_defaults=digits_defaults,
    )
    return cfg.model_copy(update={"workdir": check_workdir(cfg.workdir).resolve()})


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


def echo_line(line: str) -> None:
    """Worker output, as it comes."""
    print(line, flush=True)


@app.command()
@friendly_errors
def train(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    workers: Annotated[int | None, typer.Option(help="Training processes.")] = None,
    launcher: Annotated[str | None, typer.Option(help="torchrun or horovodrun.")] = None,
    out: Annotated[Path | None, typer.Option(help="Results folder; a folder with checkpoints is resumed.")] = None,
    model: Annotated[str | None, typer.Option(help="torchvision model name.")] = None,
    epochs: Annotated[int | None, typer.Option()] = None,
    batch_size: Annotated[int | None, typer.Option(help="Images per worker per step.")] = None,
    parallel: Annotated[str | None, typer.Option(help="data, or pipeline (the model split into --stages).")] = None,
    stages: Annotated[int | None, typer.Option(help="Pipeline stages (--parallel pipeline).")] = None,
    microbatches: Annotated[int | None, typer.Option(help="Micro-batches per step.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
    precision: Annotated[str | None, typer.Option(help="auto, bf16 or fp32.")] = None,
) -> None:
    """Train on this machine with N local workers (the process backend, as `trainflow run` does) and print the
    results folder. Every other trainer option is a `training:` setting of --config."""
    overrides = {
        "workers": workers,
        "launcher": launcher,
        "model": model,
        "epochs": epochs,
        "batch_size": batch_size,
        "parallel": parallel,
        "stages": stages,
        "microbatches": microbatches,
        "device": device,
        "precision": precision,
    }
    cfg = configure(config, data, workdir, overrides)
    cfg = with_data(cfg)
    given = out
    out = (out or cfg.workdir / "results" / datetime.now().strftime("train-%Y%m%d-%H%M%S")).resolve()
    try:
        metrics = train_here(cfg.training, cfg.data, out, cfg.workdir / "pools", echo_line)
    except KeyboardInterrupt as exc:  # a timestamped results folder is resumed only when named
        exc.add_note(f"run `{command_line()}`" + ("" if given else f" with --out {shlex.quote(str(out))}"))
        raise
    print_summary(metrics, out)


def print_summary(metrics: TrainingMetrics, out: Path) -> None:
    """The few numbers a person wants after a run."""
    top1 = metrics.final_val_top1
    accuracy = "n/a (no val/ split)" if top1 is None else f"{top1:.2%}"
    Console(highlight=False).print(
        f"\n[bold]{metrics.model}[/] on {metrics.world_size} workers ({metrics.backend}): "
        f"val top-1 {accuracy}, {metrics.images_per_sec or 0:.1f} images/s, {metrics.wall_seconds:.0f} s\n"
        f"results: {out}",
        soft_wrap=True,
    )


@app.command()
@friendly_errors
def stage(config: ConfigOpt = None, data: DataOpt = None, workdir: WorkdirOpt = None) -> None:
    """Stage the data as a Prefect flow: scripts to the file share, data set to Blob, Blob to the file server."""
    cfg = configure(config, data, workdir)
    if cfg.data in LOCAL_DATA_FREE:
        raise ConfigError(f"data: {cfg.data} has nothing to stage; pass --data DIR")
    cfg = with_data(cfg)
    with holding(cfg):
        from flows.stage import stage_data
        from infra.storage.transfers import print_summary_table

        result = stage_data(cfg)
    print_summary_table(
        [{k: v for k, v in result[step].items() if k not in ("path", "plan")} for step in ("scripts", "upload", "sync")]
    )
    print(f"file server copy of {result['dataset']}: {result['sync']['path']}")


@app.command()
@friendly_errors
def run(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what each step would do or skip; change nothing.")
    ] = False,
) -> None:
    """The whole flow: build, stage, pool, train, collect; prints the summary."""
    run_flow(configure(config, data, workdir), dry_run)


@app.command()
@friendly_errors
def smoke(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and specs; change nothing.")] = False,
) -> None:
    """The flow on 1 node x 1 worker for about a minute (synthetic data unless --data): checks a deployment."""
    run_flow(smoke_config(configure(config, data or SYNTHETIC, workdir)), dry_run)


def run_flow(cfg: FlowConfig, dry_run: bool) -> None:
    """Plan (dry run) or run the train-flow for `cfg` and print its summary."""
    check_fits(cfg.pool, cfg.training.workers)
    check_budget(cfg)  # the flow checks it too (deployments); here nothing has started yet
    if dry_run:
        return print_plan(cfg)
    cfg = with_data(cfg)
    with holding(cfg):
        from flows.train_flow import train_flow

        result = train_flow(cfg)
    print_summary(TrainingMetrics.model_validate(result["metrics"]), Path(result["out"]))
    print(f"results on the file share: {result['results']['share']}")


def print_plan(cfg: FlowConfig) -> None:
    """The dry run: each step's decision as a table, then what the backend would send its service (as YAML).
    Nothing is written, not even the digits set."""
    from flows.plan import dry_run
    from infra.storage.transfers import print_summary_table

    check_data_names(cfg)
    rows, specs = dry_run(cfg)
    print_summary_table(rows, title="trainflow run --dry-run: the plan (nothing was changed)")
    console = Console(highlight=False, soft_wrap=True)
    for name, text in specs.items():
        console.rule(f"[bold]{name}")
        console.print(text, markup=False, end="")


def with_data(cfg: FlowConfig) -> FlowConfig:
    """`cfg` with its data resolved (the digits set written once when none is named), its names checked: bad data
    fails here, before any service starts."""
    cfg = cfg.model_copy(update={"data": data_folder(cfg)})
    check_data_names(cfg)
    return cfg


@app.command()
@friendly_errors
def deploy(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    name: Annotated[str, typer.Option(help="Deployment name.")] = "scheduled",
    cron: Annotated[str | None, typer.Option(help="Cron schedule, e.g. '0 2 * * *'; none: manual runs only.")] = None,
    serve: Annotated[
        bool, typer.Option("--serve", help="Keep serving the deployment here (runs execute in this process).")
    ] = False,
) -> None:
    """Create a deployment of the flow with the config as its parameters and an optional cron schedule."""
    cfg = configure(config, data, workdir)
    if cron and not cron_valid(cron):
        raise ConfigError(
            f"--cron {cron!r} is not a cron expression such as '0 2 * * *' (minute hour day month weekday)"
        )
    cfg = with_data(cfg)
    check_access(cfg)
    with prefect_api(cfg.workdir):
        from flows.deploy import deploy_flow

        deployment_id = deploy_flow(cfg, name, cron, serve)
    print(
        f"deployment train-flow/{name} ({deployment_id}); run it with "
        f"`prefect deployment run 'train-flow/{name}'` or from the UI (`trainflow ui`)"
    )


def cron_valid(expression: str) -> bool:
    """Whether `expression` is a cron expression (Prefect's own check)."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=expression)
        return True
    except ValidationError:
        return False


@app.command()
@friendly_errors
def ui(
    workdir: WorkdirOpt = None,
    port: Annotated[int, typer.Option(help="Port of the UI and API.")] = 4200,
) -> None:
    """Start the Prefect server and UI on this machine (state under the workdir) until Ctrl-C."""
    cfg = configure(None, None, workdir)
    check_port_free(port, "another Prefect server or UI?")
    home = cfg.workdir / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    print(
        f"Prefect UI at http://127.0.0.1:{port}  (for trainflow run/deploy against it: "
        f"export PREFECT_API_URL=http://127.0.0.1:{port}/api)",
        flush=True,
    )
    # The UI asks /ui-settings where the API is; Prefect answers PREFECT_API_URL, else its default port 4200, so
    # with --port alone every page said "Can't connect to Server API". A PREFECT_UI_API_URL of the user's (a proxy) wins.
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_UI_API_URL": os.environ.get("PREFECT_UI_API_URL") or f"http://127.0.0.1:{port}/api",
    }
    prefect = str(Path(sys.executable).parent / "prefect")
    serve([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env, "Prefect server")


@app.command("mlflow-ui")
@friendly_errors
def mlflow_ui(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    port: Annotated[int, typer.Option(help="Port of MLflow's UI.")] = UI_PORT,
) -> None:
    """Start MLflow's UI on this machine over the runs' tracking store (tracking.uri, else the workdir's SQLite
    store), beside Prefect's (`trainflow ui`), until Ctrl-C."""
    cfg = configure(config, None, workdir)
    check_port_free(port, "another MLflow UI?")
    uri = store_uri(cfg.tracking, cfg.workdir)
    store_folder(cfg.workdir).mkdir(parents=True, exist_ok=True)
    print(f"MLflow UI at {local_ui(port)}  (runs from {uri})", flush=True)
    serve(ui_command(sys.executable, uri, cfg.workdir, port), dict(os.environ), "MLflow UI")


def check_port_free(port: int, guess: str) -> None:
    """Refuse a port that something already serves on."""
    if port_open(port):
        raise ConfigError(
            f"port {port} is in use ({guess}); pass --port N, or open the one running at http://127.0.0.1:{port}"
        )


def serve(command: list[str], env: dict[str, str], name: str) -> None:
    """Run a server in the foreground until it ends or Ctrl-C (how a UI is meant to end)."""
    try:
        sys.exit(subprocess.call(command, env=env))
    except KeyboardInterrupt:
        print(f"{name} stopped")


@app.command()
@friendly_errors
def build(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    flavour: Annotated[str | None, typer.Option(help="cpu (local pools) or gpu (CUDA, NCCL, MPI).")] = None,
    registry: Annotated[str | None, typer.Option(help="Registry host[:port] to push to.")] = None,
) -> None:
    """Build the training image as a Prefect flow, tagged by content, push it, and print its reference."""
    cfg = configure(config, None, workdir, digits_defaults=False, image={"flavour": flavour, "registry": registry})
    with holding(cfg):
        from flows.build import build_image

        print(build_image(cfg)["image"])


@contextmanager
def holding(cfg: FlowConfig, prefect: bool = True) -> Iterator[None]:
    """What a command that starts services holds while it runs: the workdir's lock (a second command on the same
    workdir is refused at once) and, with `prefect`, Prefect's API (`prefect_api`); the credentials and storage the
    config names are checked first (flows/preflight.py), so their mistakes end the command in about a second."""
    with workdir_lock(cfg.workdir), ExitStack() as stack:
        check_access(cfg)
        if prefect:
            stack.enter_context(prefect_api(cfg.workdir))
        yield


@contextmanager
def prefect_api(workdir: Path) -> Iterator[None]:
    """Prefect's API for the command: the server PREFECT_API_URL names, else Prefect's server started here (its
    state under the workdir) in a session of its own, so that an interrupt reaches it only after the flow has
    recorded how it ended (infra/services/prefect_server.py).

    Prefect reads its settings when it is first imported, so nothing this module imports at its top
    may import Prefect (a test checks)."""
    os.environ.setdefault("PREFECT_HOME", str(workdir / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with ExitStack() as stack:
        if not os.environ.get("PREFECT_API_URL"):
            from infra.services.prefect_server import running_prefect_server

            os.environ["PREFECT_API_URL"] = stack.enter_context(
                running_prefect_server(Path(os.environ["PREFECT_HOME"]))
            )
            stack.callback(send_what_prefect_holds)  # before the server stops (callbacks run last first)
        import prefect.main  # noqa: F401 - sets up Prefect's logging (lazily imported otherwise), adjusted below

        for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs", "uvicorn.error"):
            for handler in logging.getLogger(name).handlers:
                handler.addFilter(RedactSecrets())
                if isinstance(handler, logging.StreamHandler):
                    handler.addFilter(without_traceback)
        yield


def send_what_prefect_holds(seconds: float = 5) -> None:
    """Send the logs and events Prefect still queues to its server while it runs (at exit, it would retry a stopped
    server for minutes)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=seconds)


def without_traceback(record: logging.LogRecord) -> bool:
    """Console lines keep their message and lose the traceback (the Prefect UI keeps it); the CLI ends with one error line."""
    record.exc_info, record.exc_text = None, None
    return True


@data_app.command("digits")
@friendly_errors
def digits(config: ConfigOpt = None, data: DataOpt = None, workdir: WorkdirOpt = None) -> None:
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
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
) -> None:
    """Write an ImageNet-shaped set of small, distinct JPEGs (default: ImageNet-1k's shape, 1,331,000 files, about
    5.5 GB on disk) to --data, or under the workdir; one already there with the same shape is kept."""
    from infra.data.sample_data import ImagenetShape, write_imagenet_shaped

    shape = ImagenetShape(classes, per_class, val_per_class)
    shape.check()  # before anything is created
    cfg = configure(config, data, workdir, digits_defaults=False)
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
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Processes (default: one per core).")] = None,
) -> None:
    """Rewrite the training JPEGs of --data in place with a restart marker after every MCU: lossless (each checked to
    decode to the same pixels), so the fast loader decodes only each random crop's MCUs. Run once before staging;
    a second run rewrites only what the first did not reach."""
    from infra.data.restart_markers import add_restart_markers as rewrite

    cfg = configure(config, data, workdir, digits_defaults=False)
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


@bench_app.command("train")
@friendly_errors
def bench_train(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")] = None,
    launcher: Annotated[
        list[str], typer.Option(help="Launchers to compare: horovodrun, torchrun (repeat the option).")
    ] = ["horovodrun", "torchrun"],  # noqa: B006
    repeats: RepeatsOpt = REPEATS,
) -> None:
    """Throughput with 1 and 2 workers under Horovod and DDP, and the scaling efficiency."""
    from benchmarks.training import bench_training

    bench_training(configure(config, data, workdir, digits_defaults=False), json_out, tuple(launcher), repeats)


@bench_app.command("staging")
@friendly_errors
def bench_staging(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")] = None,
    files: Annotated[int, typer.Option(min=1, help="Images in the generated ImageNet-like folder.")] = 5000,
    classes: Annotated[int, typer.Option(min=1, help="Classes in it.")] = 100,
) -> None:
    """Staging throughput: shards against one blob per file, and the cost of an unchanged re-run.

    Stages --data if given, else an ImageNet-like folder of --files JPEGs of about 110 KB.
    """
    from benchmarks.staging import bench_staging as run_bench

    cfg = configure(config, data, workdir, digits_defaults=False)
    with holding(cfg, prefect=False):
        run_bench(cfg, json_out, files, classes)


@bench_app.command("loader")
@friendly_errors
def bench_loader(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")] = None,
    files: Annotated[int, typer.Option(min=1, help="JPEGs in the generated ImageNet-like folder.")] = 512,
    repeats: RepeatsOpt = REPEATS,
) -> None:
    """Images/s per core of each training loader (fast, pil, dali) on 1 core and on all; decode/augment/collate split.

    Reads --data's train/ if given, else --files JPEGs shaped like ImageNet's (500x375, quality 90, about 110 KB).
    """
    from benchmarks.loader import bench_loader as run_bench

    cfg = configure(config, data, workdir, digits_defaults=False)
    with holding(cfg, prefect=False):
        run_bench(cfg, json_out, files, repeats)


@bench_app.command("scale")
@friendly_errors
def bench_scale(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")] = None,
    files: Annotated[
        list[int], typer.Option(min=100, help="Data set sizes (repeat the option); ImageNet is 1331167.")
    ] = [10_000, 100_000],  # noqa: B006
) -> None:
    """Staging and training start-up as the data set grows: wall time, time per file and peak RSS of every stage.

    Each size is an ImageNet-shaped folder of small JPEGs (`trainflow data imagenet-shaped`), kept under the workdir.
    """
    from benchmarks.scale import bench_scale as run_bench

    cfg = configure(config, None, workdir, digits_defaults=False)
    with holding(cfg, prefect=False):
        run_bench(cfg, files, json_out)


@bench_app.command("images")
@friendly_errors
def bench_images(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")] = None,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds of the unchanged rebuild, both ways.")] = 3,
    cold: Annotated[bool, typer.Option(help="Build the first image without the engine's layer cache.")] = False,
) -> None:
    """Training image: an unchanged rebuild and push against `docker build` (layer cache) + `docker push`, repeated."""
    from benchmarks.images import bench_images as run_bench

    cfg = configure(config, None, workdir, digits_defaults=False)
    with holding(cfg, prefect=False):
        run_bench(cfg, json_out, rounds, cold)


@bench_app.command("all")
@friendly_errors
def bench_all(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="The figures' JSON; the report (.md) and its "
            "plots (.svg) go beside it. Default: "
            "WORKDIR/bench/all.json.",
        ),
    ] = None,
    only: Annotated[list[str], typer.Option(help="Run only these benchmarks (repeat the option).")] = [],  # noqa: B006
    size: Annotated[str, typer.Option(help="small (minutes each) or tiny (the size of their tests).")] = "small",
) -> None:
    """Every benchmark at a small size, one JSON and one markdown report with a plot per benchmark."""
    from benchmarks.suite import SIZES
    from benchmarks.suite import bench_all as run_bench

    if size not in SIZES:
        raise ConfigError(f"--size {size} is not a size: pass {' or '.join(SIZES)}")
    cfg = configure(config, None, workdir, digits_defaults=False)
    with holding(cfg, prefect=False):
        run_bench(cfg, json_out or cfg.workdir / "bench" / "all.json", tuple(only), size)


@bench_app.command("gpu")
@friendly_errors
def bench_gpu(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")] = None,
    loader: Annotated[
        list[str],
        typer.Option(
            help="Loaders to run on the JPEGs (repeat the option); default: every loader of the trainer installed here."
        ),
    ] = [],  # noqa: B006
    peak_tflops: Annotated[
        float | None, typer.Option(help="The GPU's peak dense bf16 TFLOP/s, for a GPU that the MFU table lacks.")
    ] = None,
    repeats: RepeatsOpt = REPEATS,
) -> None:
    """ResNet-50 bf16 images/s per GPU, synthetic and real JPEGs through each loader, data-wait share and MFU."""
    from benchmarks.gpu import bench_gpu as run_bench
    from benchmarks.loader import installed_loaders
    from trainer.dali import INSTALL
    from trainer.options import LOADERS

    if unknown := sorted(set(loader) - set(LOADERS)):
        raise ConfigError(f"--loader {unknown[0]} is not a loader: pass one of {', '.join(LOADERS)}")
    if missing := sorted(set(loader) - set(installed_loaders())):  # refused before any run, not after the first
        raise ConfigError(
            f"--loader {missing[0]} needs NVIDIA DALI, which is not installed here: {INSTALL}, or leave "
            "--loader out (every loader installed here)"
        )
    cfg = configure(config, None, workdir, digits_defaults=False)
    with holding(cfg, prefect=False):
        run_bench(cfg, json_out, tuple(loader) or installed_loaders(), peak_tflops, repeats)


@bench_app.command("parallel")
@friendly_errors
def bench_parallel(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")] = None,
    microbatches: Annotated[
        list[int], typer.Option(min=1, help="Micro-batch counts of the 2-stage pipeline (repeat the option).")
    ] = [1, 2, 4, 8],  # noqa: B006
    repeats: RepeatsOpt = REPEATS,
) -> None:
    """Data-parallel (2 workers) against a 2-stage pipeline with 1, 2, 4, 8 micro-batches: images/s, memory, idle."""
    from benchmarks.parallel import bench_parallel as run_bench

    run_bench(configure(config, None, workdir, digits_defaults=False), json_out, tuple(microbatches), repeats)


@bench_app.command("flow")
@friendly_errors
def bench_flow(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")] = None,
    repeats: RepeatsOpt = REPEATS,
) -> None:
    """The same job directly (torchrun) and through the whole flow with every earlier step cached: the flow's overhead."""
    cfg = with_data(configure(config, data, workdir))
    with holding(cfg, prefect=False):  # each `trainflow run` it times starts its own services in a workdir of its own
        from benchmarks.overhead import bench_flow as run_bench

        run_bench(cfg, json_out, repeats)


@runs_app.callback()
@friendly_errors
def runs(
    ctx: typer.Context,
    workdir: WorkdirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the runs as JSON (whole ids and receipts).")] = False,
) -> None:
    """The past runs under the workdir, the last ended last: status, accuracy, time, cost and receipt."""
    if ctx.invoked_subcommand:
        return
    from infra.runs.lineage import list_runs

    root = configure(None, None, workdir).workdir / "runs"
    rows = list_runs(root)
    if as_json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no runs under {root}")
    else:
        print_rows(f"runs under {root}", [run_columns(row) for row in rows])


def run_columns(row: dict) -> dict:
    """One run as the columns of `trainflow runs`: ids and hashes cut to 8 characters, as `runs diff` takes them."""
    receipt, money = row["receipt"] or {}, row["cost"]
    top1, seconds = row["val_top1"], row["seconds"]
    return {
        "run": row["run_id"][:8],
        "status": row["status"],
        "updated": row["updated"],
        "model": row["model"] or "",
        "workers": str(row["world_size"] or ""),
        "val top-1": "" if top1 is None else f"{top1:.2%}",
        "seconds": "" if seconds is None else f"{seconds:.0f}",
        "node-hours": shown(row["node_hours"]),
        "GPU-hours": shown(row["gpu_hours"]),
        "cost": "" if money is None else f"{money:.2f} {row['currency']}",
        "receipt": " ".join(
            f"{name} {str(receipt.get(key) or '-')[:8]}"
            for name, key in (("data", "data_manifest"), ("config", "config_hash"), ("params", "parameter_digest"))
        ),
    }


def shown(value) -> str:
    """A value in a table: floats to 4 decimals, nothing as an empty cell, the rest as JSON writes it."""
    if value is None:
        return ""
    return f"{value:.4f}".rstrip("0").rstrip(".") if isinstance(value, float) else json.dumps(value).strip('"')


def print_rows(title: str, rows: list[dict]) -> None:
    """Rows of strings as a table, whole whatever the terminal's width."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in rows[0]:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*row.values())
    Console(highlight=False, width=10_000).print(table, crop=False)


@runs_app.command("diff")
@friendly_errors
def runs_diff(
    a: Annotated[str, typer.Argument(help="A run id, or an unambiguous prefix of one.")],
    b: Annotated[str, typer.Argument(help="Another run id, or an unambiguous prefix of one.")],
    workdir: WorkdirOpt = None,
) -> None:
    """What differed between two runs: their receipts, configs, metrics and ledgers, field by field."""
    from infra.runs.lineage import diff_runs, find_run

    root = configure(None, None, workdir).workdir / "runs"
    first, second = find_run(root, a), find_run(root, b)
    rows = diff_runs(first, second)
    if not rows:
        print(f"runs {first.name} and {second.name} do not differ")
        return
    print_rows(
        f"{first.name} (A) against {second.name} (B)",
        [{"field": r["field"], "A": shown(r["a"]) or "-", "B": shown(r["b"]) or "-"} for r in rows],
    )


def main() -> None:
    """Entry point for `python -m flows.cli`."""
    sys.exit(app())
