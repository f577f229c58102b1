"""`trainflow runs`: the past runs under the workdir as a table (or JSON), and `runs diff`, what differed between
two of them."""

import json
from collections import Counter
from typing import Annotated

import typer
from rich.console import Console

from cli.common import WorkdirOpt, configure, friendly_errors

runs_app = typer.Typer(help="Past runs under the workdir: accuracy, time, cost, receipt.", invoke_without_command=True)


@runs_app.callback()
@friendly_errors
def runs(
    ctx: typer.Context,
    workdir: WorkdirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the runs as JSON (whole ids and receipts).")] = False,
) -> None:
    """The past runs under the workdir, the last ended last: status, accuracy, training time and cost over every
    attempt (a run killed and resumed counts the killed attempt's time), and receipt."""
    if ctx.invoked_subcommand:
        return
    from infra.runs.lineage import damage_line, list_runs

    root = configure(None, None, workdir, reads_only=True).workdir / "runs"
    rows = list_runs(root)
    if as_json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no runs under {root}")
    else:
        print_rows(f"runs under {root}", [run_columns(row) for row in rows])
        for row in rows:
            if row["damaged"]:
                print(damage_line(row, root))


def run_columns(row: dict) -> dict:
    """One run as the columns of `trainflow runs`: ids and hashes cut to 8 characters, as `runs diff` takes them."""
    receipt, money = row["receipt"] or {}, row["cost"]
    top1, seconds = row["val_top1"], row["training_seconds"]
    return {
        "run": row["run_id"][:8],
        "status": row["status"],
        "updated": row["updated"],
        "model": row["model"] or "",
        "workers": str(row["world_size"] or ""),
        "val top-1": "" if top1 is None else f"{top1:.2%}",
        "training s": "" if seconds is None else f"{seconds:.0f}",
        "attempts": attempts_cell(row["attempts"]),
        "node-hours": shown(row["node_hours"]),
        "GPU-hours": shown(row["gpu_hours"]),
        "cost": "" if money is None else f"{money:.2f} {row['currency']}",
        "receipt": " ".join(
            f"{name} {str(receipt.get(key) or '-')[:8]}"
            for name, key in (("data", "data_manifest"), ("config", "config_hash"), ("params", "parameter_digest"))
        ),
    }


def attempts_cell(attempts: list[dict]) -> str:
    """The attempts at training in a cell: how many, and how those that did not complete ended ("2: 1 killed")."""
    if not attempts:
        return ""
    unfinished = Counter(a["ended"] for a in attempts if a["ended"] != "completed")
    ended = ", ".join(f"{n} {how}" for how, n in unfinished.items())
    return f"{len(attempts)}: {ended}" if ended else str(len(attempts))


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

    root = configure(None, None, workdir, reads_only=True).workdir / "runs"
    first, second = find_run(root, a), find_run(root, b)
    rows = diff_runs(first, second)
    if not rows:
        print(f"runs {first.name} and {second.name} do not differ")
        return
    for label, folder, row in (("A", first, "a"), ("B", second, "b")):
        status = next((r[row] for r in rows if r["field"] == "run.status"), "complete")
        if status not in ("complete", None):
            print(f"run {folder.name} ({label}) is {status}: what it had not written yet shows as -")
    print_rows(
        f"{first.name} (A) against {second.name} (B)",
        [{"field": r["field"], "A": shown(r["a"]) or "-", "B": shown(r["b"]) or "-"} for r in rows],
    )
