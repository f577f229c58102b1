"""What the commands of the CLI share: the options --config, --data and --workdir (each command takes those it
reads; `python -m cli.reference` lists every command's options), reading the config, the one line on stderr for the
user, and bad input or a failed run ending in that line and an exit code, not a traceback."""

import functools
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from flows.config import FlowConfig, load_config, setting_variables_in
from flows.dataset import shrunk_folder
from flows.interrupts import EXIT_INTERRUPTED, interrupted_line, stop_on_interrupt
from flows.recipes import load_with_recipe
from infra.compute import backend_of
from infra.core.diskspace import DiskFull, Need, check_needs, existing, is_disk_full, prefect_need, unnamed_full_disk
from infra.core.errors import exit_code
from infra.core.redact import redact
from infra.data.manifest import allocated, staging_needs
from infra.engines import ENGINES
from infra.runs.workdir import check_workdir, command_line
from infra.storage.fileserver import FileServer

err = Console(stderr=True, highlight=False)

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="YAML config file (see flows/configs/).")]


def data_option(default: str, what: str = "ImageNet-layout folder or 'synthetic'") -> Any:
    """The --data option of a command, its help saying what the data may be and what the command uses without it
    (`default`: each command's own, so that a help shared by commands cannot be false for one of them)."""
    return typer.Option("--data", help=f"{what}; default: {default}.")


# What a command uses without --data; tests/unit/cli/test_help_claims.py runs each command without it and checks.
DIGITS_DEFAULT = "the config's data, else the digits set (written once under the workdir)"
DataOpt = Annotated[str | None, data_option(DIGITS_DEFAULT)]  # the commands that train or stage the config's data
WorkdirOpt = Annotated[Path | None, typer.Option("--workdir", help="Root of all local state (default .trainflow).")]
MaxSideOpt = Annotated[
    int | None,
    typer.Option(
        "--max-side",
        help="Stage every JPEG or PNG whose longer side exceeds N px re-encoded at N (a copy under the workdir; the "
        "data folder is never written); default: the config's max_side, else as they are.",
        metavar="N",
    ),
]


def setting_help(name: str) -> str:
    """The help of training setting `name` as its engines declare it (trainer/options.py), each framework's where
    they differ, and the setting it overrides."""
    frameworks: dict[str, list[str]] = {}
    for framework, engine in ENGINES.items():
        if name in engine.model_fields:
            frameworks.setdefault(engine.model_fields[name].description or "", []).append(framework)
    texts = [
        text.rstrip(".") if names == list(ENGINES) else f"{', '.join(names)}: {text.rstrip('.')}"
        for text, names in frameworks.items()
    ]
    return f"{'; '.join(texts)} (training.{name})."


def friendly_errors(command):
    """Bad input and failed runs end in one line on stderr and a non-zero exit, not a traceback (a full disk that no
    writer named too: the last net); an interrupt stops what the command started and ends in one line saying how
    to resume (flows/interrupts.py)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        with stop_on_interrupt(say):
            try:
                return command(*args, **kwargs)
            except KeyboardInterrupt as exc:
                say(interrupted_line(exc, command_line(), setting_variables_in(os.environ)))
                raise typer.Exit(EXIT_INTERRUPTED) from None
            except Exception as exc:
                code = exit_code(exc)
                if code is None:
                    raise
                unnamed = is_disk_full(exc) and not isinstance(exc, DiskFull)
                say(f"error: {unnamed_full_disk(exc) if unnamed else exc}")
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
    recipe: bool = True,
    max_side: int | None = None,
    tell_recipe: bool = False,
    reads_only: bool = False,
    **sections: dict,
) -> FlowConfig:
    """The validated config (file, environment, then these command-line overrides) with its workdir absolute and
    usable and, with `recipe`, what it leaves out filled in by the recipe that fits its data (flows/recipes.py: the
    digits set's when no data is named); `tell_recipe` prints which and why first. Every command reads its config
    here; `reads_only`: the command only reads the workdir (a read-only one will do)."""
    overrides = {"data": data, "workdir": workdir, "max_side": max_side, "training": training or {}, **sections}
    if recipe:
        cfg, picked = load_with_recipe(config, overrides)
        if tell_recipe:
            print(picked.line(), flush=True)  # on stdout, the first line of the run and of its plan
        if warning := picked.warning(cfg.training.image_size):
            say(warning)
    else:
        cfg = load_config(config, overrides)
    return cfg.model_copy(update={"workdir": check_workdir(cfg.workdir, writes=not reads_only).resolve()})


def pool_for_workers(config: Path | None, workers: str | None) -> dict:
    """The pool settings `--workers` implies: on a pool of one node (the process pool) its slots follow the workers;
    a pool of several nodes gets the workers spread evenly over its nodes (Azure ML starts nodes x slots_per_node
    processes), or keeps its slots where they do not divide evenly (the config's check then names both)."""
    if not workers:
        return {}
    pool = load_config(config, {}).pool
    nodes = backend_of(pool).nodes(pool)
    if nodes == 1:
        return {"slots_per_node": workers}
    count = int(workers) if str(workers).isdigit() else 0  # `auto` counts this machine's GPUs: not a node's
    return {"slots_per_node": count // nodes} if count and count % nodes == 0 else {}


def check_staging_space(cfg: FlowConfig) -> None:
    """Refuse, before anything starts, a staging of cfg's data folder that the disks under it cannot hold: its
    index, its shards while packed, Azurite's copy (the local default), the file server's copy when this
    machine syncs it (infra/data/manifest.py's staging_needs), the shrunk copy with `max_side` set and Prefect's
    database when the command starts it. The later copies are counted at the originals' size: the shrunk ones
    are smaller."""
    data = Path(cfg.data or "")
    if not cfg.data or not data.is_dir():
        return
    azurite = cfg.workdir / "azurite" if cfg.storage.backend == "azurite" else None
    here = backend_of(cfg.pool).sync_where(cfg.pool) == "here"
    current = FileServer(cfg.export_dir()).current(cfg.dataset_name()) if here else None
    needs = staging_needs(data, cfg.workdir / "cache", cfg.workdir / "tmp", azurite, current)
    shrunk = shrunk_folder(cfg)
    if shrunk:
        needs.append(shrunk_need(data, shrunk))
    if not os.environ.get("PREFECT_API_URL"):  # the command starts Prefect's server (cli/services.py)
        needs.append(prefect_need(Path(os.environ.get("PREFECT_HOME") or cfg.workdir / "prefect")))
    check_needs(needs, f"staging {cfg.dataset_name()}")


def shrunk_need(data: Path, shrunk: Path) -> Need:
    """The shrunk copy's room, at most: the data folder's size less what the copy holds already (a hard link, where
    a file is small enough, takes no room, but a copy on another disk does)."""
    block = os.statvfs(existing(shrunk)).f_frsize
    kept = allocated(shrunk, block)[2] if shrunk.exists() else 0
    return Need(shrunk, max(0, allocated(data, block)[2] - kept), "the shrunk copy (at most the originals' size)")
