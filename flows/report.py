"""What a person sees of a finished run in the Prefect UI: a summary, a table of epochs, a plot, a link."""

from pathlib import Path

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run

from infra.core.jsonfiles import read_json
from infra.runs.ledger import LEDGER, ledger_lines
from infra.runs.tracking import local_ui, run_page
from tasks.track_run import step_durations

PLOT = "plot.svg"

PLOT_SERIES = (
    ("train_loss", "train loss", "#d62728"),
    ("val_top1", "val top-1", "#1f77b4"),
    ("images_per_sec", "images/s", "#2ca02c"),
)


def summary_markdown(summary: dict, durations: dict[str, float]) -> str:
    """The run in a few lines: data, model, workers, speed, accuracy, and the time of each step."""
    m = summary["metrics"]
    top1 = m.get("final_val_top1")
    lines = [
        f"# Training run `{summary['run_id']}`",
        "",
        f"- data set: `{summary['dataset']}`",
        f"- model: `{m['model']}` ({m.get('framework', 'pytorch')})",
        f"- world size: {m['world_size']} ({m['backend']}) on the {summary['pool']['backend']} pool",
        f"- throughput: {m['images_per_sec']:.1f} images/s",
        *data_wait_lines(m.get("data_wait_share")),
        *tracking_lines(summary.get("tracking")),
        f"- final val top-1: {'n/a (no val/ split)' if top1 is None else f'{top1:.2%}'}",
        f"- image: `{summary['image'] or 'none (process pool)'}`",
        f"- results: `{summary['results']['share']}`",
        *bad_files_lines(m, summary["results"]["share"]),
        "",
        "| step | did | why | files | MB | seconds |",
        "|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row.values()) + " |" for row in step_rows(summary.get("done", []), durations)]
    return "\n".join(lines + attempt_lines(summary.get("attempts") or []) + ledger_lines(summary.get("ledger"))) + "\n"


def step_rows(done: list[dict], seconds: dict[str, float]) -> list[dict[str, str]]:
    """One row per step of a run: ran or skipped and why, the files and MB it moved, its seconds (its Prefect task's
    in `seconds`, else a transfer's own); then the flow's other tasks (tracking, the ledger, deleting the pool),
    which ran and say no more."""
    rows = [
        {
            "step": row["step"],
            "did": row["did"],
            "why": row["why"],
            "files": str(row.get("files", "")),
            "MB": str(row.get("MB", "")),
            "seconds": f"{seconds.get(row['step'], row.get('seconds', 0.0)):.1f}",
        }
        for row in done
    ]
    steps = {row["step"] for row in done}
    others = [(name, took) for name, took in seconds.items() if name not in steps]
    blank = {"why": "", "files": "", "MB": ""}
    return rows + [{"step": name, "did": "ran", **blank, "seconds": f"{took:.1f}"} for name, took in others]


def data_wait_lines(shares: list[float] | None) -> list[str]:
    """Each rank's share of the last epoch spent waiting for the loader: the first thing to read when GPUs are
    underfed (every step waits for the slowest rank)."""
    if not shares:
        return []
    per_rank = ", ".join(f"rank {rank} {share:.1%}" for rank, share in enumerate(shares))
    return [f"- waiting for data (share of each training step, last epoch): {per_rank}"]


def tracking_lines(tracked: dict | None) -> list[str]:
    """Where the run is in MLflow, and how to open it."""
    if not tracked:
        return []
    where = f"`{tracked['uri']}`"
    if tracked["uri"].startswith("sqlite:"):  # the workdir's store: its UI is `trainflow mlflow-ui`
        where += f" ([open]({run_page(tracked, local_ui())}) with `trainflow mlflow-ui`)"
    return [f"- MLflow run: `{tracked['run_id']}` in {where}"]


def bad_files_lines(metrics: dict, results: str) -> list[str]:
    """The images the run left out (training.bad_files: skip), and where in the results they are listed."""
    bad = metrics.get("bad_files")
    if not bad:
        return []
    listing = f"{results.rstrip('/')}/{Path(bad['list']).name}"
    return [f"- images left out (cannot be decoded): {bad['count']}, listed in `{listing}`"]


def attempt_lines(attempts: list[dict]) -> list[str]:
    """The attempts a backend made itself (pre-empted, failed, completed), as a table; none for one-attempt jobs."""
    if not attempts:
        return []
    lines = ["", "| attempt | job | ended | why | GPU-hours | lost steps |", "|---|---|---|---|---|---|"]
    return lines + [
        f"| {a['attempt']} | `{a['job']}` | {a['ended']} | {a['why']} | {a['gpu_hours']} | {a['lost_steps']} |"
        for a in attempts
    ]


def epoch_rows(metrics: dict) -> list[dict]:
    """One row per epoch, rounded for reading."""
    keys = ("epoch", "train_loss", "val_top1", "val_top5", "images_per_sec", "lr", "epoch_seconds")
    return [
        {k: round(e[k], 4) if isinstance(e.get(k), float) else e.get(k) for k in keys if k in e}
        for e in metrics.get("epochs", [])
    ]


def svg_plot(rows: list[dict], width: int = 480, height: int = 160) -> str:
    """Loss, val top-1 and images/s per epoch as one small SVG, each series scaled to its own range."""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20}">']
    for i, (key, label, colour) in enumerate(PLOT_SERIES):
        values = [r[key] for r in rows if r.get(key) is not None]
        if not values:
            continue
        low, span = min(values), (max(values) - min(values)) or 1.0
        step = (width - 20) / max(1, len(values) - 1)
        points = " ".join(
            f"{10 + j * step:.1f},{10 + (height - 20) * (1 - (v - low) / span):.1f}" for j, v in enumerate(values)
        )
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        parts.append(
            f'<text x="{10 + i * 150}" y="{height + 15}" fill="{colour}" font-size="12">'
            f"{label} {min(values):.3g}-{max(values):.3g}</text>"
        )
    return "\n".join(parts + ["</svg>"])


def write_plot(out: Path, metrics: dict) -> None:
    """The plot of the run's epochs, as plot.svg in its folder (the results step writes it before the copy)."""
    (out / PLOT).write_text(svg_plot(epoch_rows(metrics)))


@task(name="publish-report", retries=2, retry_delay_seconds=5)
def publish_report_task(summary: dict) -> dict[str, float]:
    """Prefect step: the run's artifacts (summary with the ledger the results step wrote, epochs table, plot, link
    to the results); returns the seconds of each step of this flow run."""
    rows = epoch_rows(summary["metrics"])
    plot = svg_plot(rows)
    durations = step_durations([flow_run.get_id() or "local"])
    summary = {**summary, "ledger": read_json(Path(summary["out"]) / LEDGER)}
    create_markdown_artifact(key="run-summary", markdown=summary_markdown(summary, durations))
    create_table_artifact(key="epochs", table=rows, description="Per-epoch metrics")
    create_markdown_artifact(key="training-plot", markdown=f"# Loss, accuracy and throughput per epoch\n\n{plot}\n")
    create_link_artifact(key="results", link=summary["results"]["share"], link_text="results of this run")
    return durations
