"""The commands that train, and those that prepare a run: `trainflow train` on this machine, the whole flow (`run`,
`smoke`, its dry run), staging the data (`stage`), building the training image (`build`) and scheduling the flow
(`deploy`)."""

import shlex
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cli.common import (
    ConfigOpt,
    DataOpt,
    MaxSideOpt,
    WorkdirOpt,
    check_staging_space,
    configure,
    data_option,
    friendly_errors,
    pool_for_workers,
    say,
    setting_help,
)
from cli.services import holding, prefect_api
from flows.config import LOCAL_DATA_FREE, ConfigError, FlowConfig, smoke_config
from flows.dataset import check_batch, check_data_names, with_data
from flows.preflight import check_access
from infra.compute import backend_of, check_installed
from infra.compute.base import LocalBackend
from infra.compute.process import train_here
from infra.core.errors import BadInput
from infra.engines import ENGINES
from infra.engines.contract import METRICS, SYNTHETIC, Metrics, metrics_from
from infra.runs.ledger import check_budget
from infra.runs.workdir import command_line
from nodelib.cores import usable_cores
from trainer.model_files import IMAGENET, KERAS, arch_named_by, framework_of

FrameworkOpt = Annotated[
    str | None, typer.Option(help=f"Training framework (training.framework): {', '.join(ENGINES)}.")
]

LauncherOpt = Annotated[str | None, typer.Option(help="torchrun or horovodrun (training.launcher).")]

BadFilesOpt = Annotated[
    str | None,
    typer.Option(
        help="fail or skip: what to do with images that cannot be decoded; fail refuses them in one line, skip "
        "trains without them and lists them (training.bad_files).",
        show_default=False,
    ),
]

SmokeDataOpt = Annotated[
    str | None, data_option("synthetic (one random batch, no files read), whatever the config's data")
]

InitFromOpt = Annotated[
    str | None,
    typer.Option(
        help="Fine-tune from these weights (training.init_from): a run id, a model file, or imagenet.",
        show_default=False,
    ),
]


WorkersOpt = Annotated[  # a count or auto, checked with the config (training.workers, pool.slots_per_node)
    str | None, typer.Option(help=setting_help("workers"), metavar="N|auto", show_default=False)
]


@friendly_errors
def train(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    workers: WorkersOpt = None,
    framework: FrameworkOpt = None,
    launcher: LauncherOpt = None,
    init_from: InitFromOpt = None,
    bad_files: BadFilesOpt = None,
    out: Annotated[Path | None, typer.Option(help="Results folder; a folder with checkpoints is resumed.")] = None,
    model: Annotated[str | None, typer.Option(help=setting_help("model"))] = None,
    epochs: Annotated[int | None, typer.Option(help=setting_help("epochs"))] = None,
    batch_size: Annotated[int | None, typer.Option(help=setting_help("batch_size"))] = None,
    parallel: Annotated[str | None, typer.Option(help=setting_help("parallel"))] = None,
    stages: Annotated[int | None, typer.Option(help=setting_help("stages"))] = None,
    microbatches: Annotated[int | None, typer.Option(help=setting_help("microbatches"))] = None,
    device: Annotated[str | None, typer.Option(help=setting_help("device"))] = None,
    precision: Annotated[str | None, typer.Option(help=setting_help("precision"))] = None,
) -> None:
    """Train on this machine with N local workers (the process backend, as `trainflow run` does) and print the
    results folder. Every other trainer option is a `training:` setting of --config."""
    overrides = {
        "workers": workers,
        "framework": framework,
        "launcher": launcher,
        "init_from": init_from,
        "bad_files": bad_files,
        "model": model,
        "epochs": epochs,
        "batch_size": batch_size,
        "parallel": parallel,
        "stages": stages,
        "microbatches": microbatches,
        "device": device,
        "precision": precision,
    }
    # it trains on processes here, one a worker: the pool's slots follow --workers
    pool = {"slots_per_node": workers} if workers else {}
    cfg = with_data(configure(config, data, workdir, overrides, tell_recipe=True, pool=pool))
    check_init_weights(cfg.training)
    warn_if_oversubscribed(cfg.training.workers)
    given = out
    out = (out or cfg.workdir / "results" / datetime.now().strftime("train-%Y%m%d-%H%M%S")).resolve()
    try:
        metrics = train_here(cfg.training, str(cfg.data), out, cfg.workdir / "pools", echo_line)
    except KeyboardInterrupt as exc:  # a timestamped results folder is resumed only when named
        exc.add_note(f"run `{command_line()}`" + ("" if given else f" with --out {shlex.quote(str(out))}"))
        raise
    print_summary(metrics, out)


def warn_if_oversubscribed(workers: int) -> None:
    """One line when more workers are to run on this machine than it has cores: allowed (a test of a larger world
    on a laptop), but each worker then gets part of a core and the run is slower than with fewer."""
    cores = usable_cores()
    if workers > cores:
        say(
            f"warning: {workers} workers on {cores} cores oversubscribe this machine (each worker gets part of a "
            f"core, so the run is no faster than with {cores}); set training.workers (--workers) to {cores} or "
            "fewer unless that is what you test"
        )


def echo_line(line: str) -> None:
    """Worker output, as it comes."""
    print(line, flush=True)


def print_summary(metrics: Metrics, out: Path) -> None:
    """The few numbers a person wants after a run."""
    top1 = metrics.final_val_top1
    accuracy = "n/a (no val/ split)" if top1 is None else f"{top1:.2%}"
    Console(highlight=False).print(
        f"\n[bold]{metrics.model}[/] ({metrics.framework}) on {metrics.world_size} workers ({metrics.backend}): "
        f"val top-1 {accuracy}, {metrics.images_per_sec or 0:.1f} images/s, {metrics.wall_seconds:.0f} s\n"
        f"results: {out}",
        soft_wrap=True,
    )


@friendly_errors
def stage(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    max_side: MaxSideOpt = None,
    bad_files: BadFilesOpt = None,
) -> None:
    """Stage the data as a Prefect flow: scripts to the file share, data set to Blob, Blob to the file server."""
    cfg = configure(config, data, workdir, {"bad_files": bad_files}, max_side=max_side)
    if cfg.data in LOCAL_DATA_FREE:
        raise ConfigError(f"data: {cfg.data} has nothing to stage; pass --data DIR")
    cfg = with_data(cfg)
    check_staging_space(cfg)
    with holding(cfg):
        from flows.stage import stage_data
        from infra.storage.transfers import print_summary_table

        result = stage_data(cfg)
    print_summary_table(
        [{k: v for k, v in result[step].items() if k not in ("path", "plan")} for step in ("scripts", "upload", "sync")]
    )
    print(f"file server copy of {result['dataset']}: {result['sync']['path']}")


ScriptOpt = Annotated[
    Path | None,
    typer.Option(
        "--script",
        help="A folder with a training script of your own, run instead of trainflow's trainer: `--script DIR -- "
        "ENTRY [ARG...]` (script.source; ENTRY a file of DIR or -m MODULE).",
        show_default=False,
    ),
]
MetricOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--metric",
        help="NAME=REGEX: a metric read from rank 0's lines, the regex's one group its value (script.metrics).",
        show_default=False,
    ),
]
EnvOpt = Annotated[
    list[str] | None,
    typer.Option("--env", help="KEY=VALUE for every rank of the script (script.env).", show_default=False),
]
CommandArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[-- ENTRY [ARG...]]", help="After --: the script's ENTRY and its arguments.", show_default=False
    ),
]


@friendly_errors
def run(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    framework: FrameworkOpt = None,
    launcher: LauncherOpt = None,
    workers: WorkersOpt = None,
    batch_size: Annotated[int | None, typer.Option(help=setting_help("batch_size"))] = None,
    init_from: InitFromOpt = None,
    max_side: MaxSideOpt = None,
    bad_files: BadFilesOpt = None,
    script: ScriptOpt = None,
    metric: MetricOpt = None,
    env: EnvOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what each step would do or skip; change nothing.")
    ] = False,
    entry: CommandArg = None,
) -> None:
    """The whole flow: build, stage, pool, train, collect; prints the summary. With --script, your own training
    script instead of trainflow's trainer."""
    overrides = {
        "framework": framework,
        "launcher": launcher,
        "workers": workers,
        "batch_size": batch_size,
        "init_from": init_from,
        "bad_files": bad_files,
    }
    section = script_section(script, entry or [], metric or [], env or [])
    trainers = {"--batch-size": batch_size, "--init-from": init_from, "--bad-files": bad_files}
    if section and (given := [name for name, value in trainers.items() if value is not None]):
        raise BadInput(
            f"{', '.join(given)} set trainflow's own trainer, which a --script run does not start; your script takes "
            "its own arguments after -- (e.g. -- train.py --batch-size 64)"
        )
    sections = {"pool": pool_for_workers(config, workers), **({"script": section} if section else {})}
    recipe = not section  # a script brings its own settings: no recipe of trainflow's trainer fills them
    cfg = configure(
        config, data, workdir, overrides, recipe, max_side, tell_recipe=recipe, reads_only=dry_run, **sections
    )
    run_flow(cfg, dry_run)


def script_section(source: Path | None, command: list[str], metrics: list[str], env: list[str]) -> dict | None:
    """The script section the command line gives (None: none), from --script, the words after --, --metric and
    --env; an ENTRY without --script, or the other way round, is refused."""
    if source is None:
        if command or metrics or env:
            named = "ENTRY after --" if command else "--metric" if metrics else "--env"
            raise ConfigError(f"{named} is for a script of your own: pass --script DIR as well")
        return None
    if not command:
        raise ConfigError(
            f"--script {source} needs the entry to run after --: `--script {source} -- train.py [ARG...]`"
        )
    entry, args = (
        (f"-m {command[1]}", command[2:]) if command[0] == "-m" and len(command) > 1 else (command[0], command[1:])
    )
    return {
        "source": source,
        "entry": entry,
        "args": args,
        "metrics": pairs(metrics, "--metric", "NAME=REGEX"),
        "env": pairs(env, "--env", "KEY=VALUE"),
    }


def pairs(given: list[str], option: str, form: str) -> dict[str, str]:
    """NAME=VALUE options as a mapping; one without `=` or a name is refused."""
    found = {}
    for item in given:
        name, equals, value = item.partition("=")
        if not equals or not name.strip():
            raise ConfigError(f"{option} {item!r} is not {form}")
        found[name.strip()] = value
    return found


@friendly_errors
def smoke(
    config: ConfigOpt = None,
    data: SmokeDataOpt = None,
    workdir: WorkdirOpt = None,
    bad_files: BadFilesOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and specs; change nothing.")] = False,
) -> None:
    """The flow on 1 node x 1 worker for about a minute (synthetic data unless --data): checks a deployment."""
    cfg = configure(config, data or SYNTHETIC, workdir, {"bad_files": bad_files})
    run_flow(smoke_config(cfg), dry_run)


def check_init_weights(training) -> None:
    """The PyTorch weights file --init-from names, read before anything starts (the trainer reads it again, after
    staging): a file cut short, or weights of another architecture than training.model, refused in one line now."""
    given = getattr(training, "init_from", "")
    if not given or given == IMAGENET or framework_of(Path(given)) == KERAS:  # a Keras file: its trainer checks it
        return
    from trainer.models import model_names, read_torch  # torch: only where weights are given

    weights = read_torch(Path(given), "--init-from")
    theirs = weights.arch or arch_named_by(Path(given), model_names())
    if theirs and theirs != training.model:
        raise BadInput(
            f"--init-from {given} holds a {theirs} model, and this run trains {training.model}: set training.model: "
            f"{theirs} (in --config; `trainflow train` takes --model {theirs}), or pass weights of a {training.model}"
        )


def run_flow(cfg: FlowConfig, dry_run: bool) -> None:
    """Plan (dry run) or run the train-flow for `cfg` and print its summary."""
    check_installed(cfg.pool, cfg.training)
    check_budget(cfg)  # the flow checks it too (deployments); here nothing has started yet
    check_init_weights(cfg.training)
    if isinstance(backend_of(cfg.pool), LocalBackend):  # its workers, in processes or containers, share this machine
        warn_if_oversubscribed(cfg.training.workers)
    if dry_run:
        return print_plan(cfg)
    cfg = with_data(cfg, training=True)
    check_staging_space(cfg)
    with holding(cfg):
        from flows.train_flow import train_flow

        result = train_flow(cfg)
    from flows.report import step_rows
    from infra.storage.transfers import print_summary_table

    print_summary_table(step_rows(result["done"], result["step_seconds"]), title="what each step did")
    if cfg.script:
        print_script_summary(result["metrics"], Path(result["out"]))
    else:
        print_summary(metrics_from(METRICS.validate_python, result["metrics"], result["out"]), Path(result["out"]))
    print(f"results on the file share: {result['results']['share']}")


def print_script_summary(summary: dict, out: Path) -> None:
    """A script run in a few lines: what ran, its metrics' last values, a regex that never matched."""
    finals = ", ".join(f"{name} {value:.4g}" for name, value in summary["final"].items()) or "no metrics read"
    Console(highlight=False).print(
        f"\n[bold]{summary['entry']}[/] ({summary['framework']}) on {summary['world_size']} workers "
        f"({summary['launcher']}): {finals}, {summary.get('wall_seconds') or 0:.0f} s\nresults: {out}",
        soft_wrap=True,
    )
    if summary["unmatched"]:
        say(f"warning: --metric {', '.join(summary['unmatched'])} never matched a line of rank 0; check the regex")


def print_plan(cfg: FlowConfig) -> None:
    """The dry run: each step's decision as a table, then what the backend would send its service (as YAML).
    Nothing is written, not even the digits set."""
    from flows.plan import dry_run
    from infra.storage.transfers import print_summary_table

    check_batch(cfg, check_data_names(cfg))
    rows, specs = dry_run(cfg)
    print_summary_table(rows, title="trainflow run --dry-run: the plan (nothing was changed)")
    console = Console(highlight=False, soft_wrap=True)
    for name, text in specs.items():
        console.rule(f"[bold]{name}")
        console.print(text, markup=False, end="")


@friendly_errors
def deploy(
    config: ConfigOpt = None,
    data: DataOpt = None,
    workdir: WorkdirOpt = None,
    name: Annotated[str, typer.Option(help="Deployment name.")] = "scheduled",
    cron: Annotated[str | None, typer.Option(help="Cron schedule, e.g. '0 2 * * *'; none: manual runs only.")] = None,
    serve: Annotated[
        bool,
        typer.Option(
            "--serve", help="Keep serving the deployment here: each run executes in a process this command starts."
        ),
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


@friendly_errors
def build(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    flavour: Annotated[str | None, typer.Option(help="cpu (local pools) or gpu (CUDA, NCCL, MPI).")] = None,
    registry: Annotated[str | None, typer.Option(help="Registry host[:port] to push to.")] = None,
    framework: FrameworkOpt = None,
) -> None:
    """Build the training image of a framework as a Prefect flow, tagged by content, push it, and print its
    reference."""
    image = {"flavour": flavour, "registry": registry}
    cfg = configure(config, None, workdir, {"framework": framework}, recipe=False, image=image)
    with holding(cfg):
        from flows.build import build_image

        print(build_image(cfg)["image"])
