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

# The plot's panels, one per quantity: its title, its y axis, and the series drawn in it (key of epoch_rows, legend
# label, colour, factor from the stored value to the axis's unit).
PLOT_PANELS = (
    ("loss", "training loss (cross-entropy)", [("train_loss", "train", "#d62728", 1.0)]),
    (
        "accuracy",
        "validation accuracy (%)",
        [("val_top1", "top-1", "#1f77b4", 100.0), ("val_top5", "top-5", "#9ecae1", 100.0)],
    ),
    ("throughput", "training throughput (images/s)", [("images_per_sec", "all workers", "#2ca02c", 1.0)]),
)


def summary_markdown(summary: dict, durations: dict[str, float]) -> str:
    """The run in a few lines: data, model, workers, speed, accuracy, and the time of each step."""
    m = summary["metrics"]
    lines = [
        f"# Training run `{summary['run_id']}`",
        "",
        f"- data set: `{summary['dataset']}`",
        *(script_lines if m.get("kind") == "script" else trainer_lines)(m, summary["pool"]["backend"]),
        *tracking_lines(summary.get("tracking")),
        f"- image: `{summary['image'] or 'none (process pool)'}`",
        f"- results: `{summary['results']['share']}`",
        *bad_files_lines(m, summary["results"]["share"]),
        "",
        "| step | did | why | files | MB | seconds |",
        "|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row.values()) + " |" for row in step_rows(summary.get("done", []), durations)]
    return "\n".join(lines + attempt_lines(summary.get("attempts") or []) + ledger_lines(summary.get("ledger"))) + "\n"


def trainer_lines(m: dict, pool: str) -> list[str]:
    """The trainer's run: model, world size, speed, accuracy."""
    top1 = m.get("final_val_top1")
    return [
        f"- model: `{m['model']}` ({m.get('framework', 'pytorch')})",
        f"- world size: {m['world_size']} ({m['backend']}) on the {pool} pool",
        f"- throughput: {m['images_per_sec']:.1f} images/s",
        *data_wait_lines(m.get("data_wait_share")),
        f"- final val top-1: {'n/a (no val/ split)' if top1 is None else f'{top1:.2%}'}",
    ]


def script_lines(m: dict, pool: str) -> list[str]:
    """A script's run: what ran, on how many workers, and the last value of each metric read from it."""
    finals = ", ".join(f"{name} {value:.4g}" for name, value in m.get("final", {}).items()) or "none read"
    unmatched = [f"- never matched: {', '.join(m['unmatched'])}"] if m.get("unmatched") else []
    return [
        f"- script: `{' '.join([m['entry'], *m['args']])}` ({m['framework']}) from `{m['source']}`",
        f"- world size: {m['world_size']} ({m['launcher']}) on the {pool} pool, {m.get('wall_seconds') or 0:.0f} s",
        f"- metrics: {finals}",
        *unmatched,
    ]


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


def svg_plot(rows: list[dict]) -> str:
    """The epochs as an SVG chart: a panel per quantity (loss, validation accuracy, throughput) against the epoch,
    each with its axes, its unit and a legend; a panel with no value says so."""
    from matplotlib.ticker import MaxNLocator  # here: matplotlib only where a plot is drawn, not at every command

    from infra.core.plots import new_figure, svg_text

    fig, axes = new_figure(1, len(PLOT_PANELS), size=(11, 3.2))
    for ax, (title, axis, series) in zip(axes, PLOT_PANELS):
        for key, label, colour, factor in series:
            points = [(r["epoch"], r[key] * factor) for r in rows if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", color=colour, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("epoch")
        ax.set_ylabel(axis, fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no epoch recorded", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    return svg_text(fig, text=True)


def write_plot(out: Path, metrics: dict) -> None:
    """The plot of the run's epochs, as plot.svg in its folder (the results step writes it before the copy)."""
    (out / PLOT).write_text(svg_plot(epoch_rows(metrics)))


@task(name="publish-report", retries=2, retry_delay_seconds=5)
def publish_report_task(summary: dict) -> dict[str, float]:
    """Prefect step: the run's artifacts (summary with the ledger the results step wrote, epochs table, plot, link
    to the results); returns the seconds of each step of this flow run."""
    rows = epoch_rows(summary["metrics"])
    plot = (Path(summary["out"]) / PLOT).read_text()  # drawn once, by the results step (write_plot)
    durations = step_durations([flow_run.get_id() or "local"])
    summary = {**summary, "ledger": read_json(Path(summary["out"]) / LEDGER)}
    create_markdown_artifact(key="run-summary", markdown=summary_markdown(summary, durations))
    create_table_artifact(key="epochs", table=rows, description="Per-epoch metrics")
    create_markdown_artifact(key="training-plot", markdown=f"# Loss, accuracy and throughput per epoch\n\n{plot}\n")
    create_link_artifact(key="results", link=summary["results"]["share"], link_text="results of this run")
    return durations
