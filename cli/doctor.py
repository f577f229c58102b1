"""`trainflow doctor`: one table of what this machine has and what each feature needs (flows/doctor.py)."""

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from cli.common import WorkdirOpt
from flows.doctor import Row, examine


def doctor(workdir: WorkdirOpt = None) -> None:
    """Show what this machine has for each feature, and the command that fixes what is missing; exit 1 when the
    local default (`make demo`) lacks something."""
    rows = examine((workdir or Path(".trainflow")).absolute())
    # On a terminal, lines fold at its width (nothing cut short); into a pipe or a file, each row is one whole line,
    # so that a value to copy (a path, PREFECT_API_URL) is never cut with "…"
    width = None if sys.stdout.isatty() else 10_000
    Console(highlight=False, width=width).print(table(rows), soft_wrap=True)
    if any(row.required and not row.ok for row in rows):
        raise typer.Exit(1)


def table(rows: list[Row]) -> Table:
    """The rows as a person reads them: ✓ and what was found, or ✗ and the fix (· where its absence is no fault)."""
    out = Table(title="what this machine has", title_justify="left")
    for column in ("part", "for", "here"):
        out.add_column(column, overflow="fold")
    for row in rows:
        mark = "[green]✓[/]" if row.ok else ("[dim]·[/]" if row.optional else "[red]✗[/]")
        here = f"{mark} {row.found if row.ok else row.fix}"
        out.add_row(row.part + (" (needed)" if row.required else ""), row.serves, here)
    return out
