"""What every command of the CLI shares: the options --config, --data and --workdir, reading the config, the one
line on stderr for the user, and bad input or a failed run ending in that line and an exit code, not a traceback."""

import functools
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from flows.config import FlowConfig, load_config
from flows.interrupts import EXIT_INTERRUPTED, interrupted_line, stop_on_interrupt
from infra.core.errors import exit_code
from infra.core.redact import redact
from infra.runs.workdir import check_workdir, command_line

err = Console(stderr=True, highlight=False)

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="YAML config file (see flows/configs/).")]
DataOpt = Annotated[
    str | None, typer.Option("--data", help="ImageNet-layout folder or 'synthetic'; default: the digits set.")
]
WorkdirOpt = Annotated[Path | None, typer.Option("--workdir", help="Root of all local state (default .trainflow).")]


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
