"""The benchmarks' report: one markdown file with, per benchmark, a plot (an SVG beside it), a table of every figure as
median (min-max) and the ratios the benchmark computes within its rounds, from the benchmarks' own JSON.

`trainflow bench all` writes it after running them. The committed measurements are dated reports: each JSON in
docs/benchmarks/ says when, how and on what it was measured (its "measured" entry beside "machine"), and
`python -m benchmarks.report` writes one page per JSON beside it and the index of them all
(tests/unit/benchmarks/test_dated_reports.py fails when the committed pages differ from what it writes).
"""

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESTARTS, shown
from benchmarks.install import NAMES, lines
from benchmarks.script import script_lines
from flows.config import ConfigError
from infra.core.plots import new_figure, save_svg


@dataclass
class Chart:
    """What one benchmark's plot and table show: bars of repeated figures (or single values) in one unit, and the
    lines of ratios under the table."""

    title: str
    unit: str
    bars: list[tuple[str, dict | float]]
    ratios: list[str]
    log: bool = False


def figure_of(value: dict | float) -> dict:
    """A repeated figure as it is; a single measurement as a figure whose min and max are itself."""
    return value if isinstance(value, dict) else {"median": value, "min": value, "max": value, "all": [value]}


def staging_chart(r: dict) -> Chart:
    """Seconds of each staging path; trainflow's speed-ups."""
    return Chart(
        f"staging {r['files']:,} files ({r['bytes'] / 1e6:.0f} MB) through Azurite to the file server",
        "seconds (lower is better)",
        [(path, f["seconds"]) for path, f in r["paths"].items()],
        [
            f"trainflow vs per file, one at a time: {shown(r['speedup_vs_one_at_a_time'], '.1f')}x faster",
            f"trainflow vs per file, {r['upload_concurrency']} threads: {shown(r['speedup_vs_thread_pool'], '.1f')}x"
            " faster",
            f"unchanged re-run: {shown(r['rerun_fraction'], '.3f')} of the first",
        ],
    )


def training_chart(r: dict) -> Chart:
    """Steady images/s of every launcher and worker count and of the ceiling's runs; the efficiencies."""
    s = r["settings"]
    bars = [
        (f"{run['backend']}, {run['workers']} worker{'s' * (run['workers'] > 1)}", run["images_per_sec"])
        for run in r["runs"]
    ]
    bars += [
        ("one process alone", r["alone_images_per_sec"]),
        ("two independent processes", r["independent_2x1_images_per_sec"]),
    ]
    ceiling = r.get("of_the_ceiling", {})  # measurements before 2026-11-25 did not compute it
    ratios = [
        f"scaling efficiency at 2 workers, {b}: {shown(f, '.2f')}"
        + (f", {shown(ceiling[b], '.2f')} of the machine's ceiling" if b in ceiling else "")
        for b, f in r["scaling_efficiency"].items()
    ]
    steps = [
        f"{b} per step: 1 worker {shown(ms['step_ms_1_worker'], '.0f')} ms, 2 workers "
        f"{shown(ms['step_ms_2_workers'], '.0f')} ms, of which the machine {shown(ms['machine_ms'], '.0f')} ms and "
        f"communication {shown(ms['communication_ms'], '.0f')} ms"
        for b, ms in r["per_step_ms"].items()
    ]
    against = [
        f"{b} scaling efficiency minus PyTorch's, within each round: {shown(f, '+.2f')}"
        for b, f in r.get("against_pytorch", {}).items()
    ]
    return Chart(
        f"synthetic training: {s['model']}, {s['image_size']} px, batch {s['batch_size']} per worker",
        "steady images/s (higher is better)",
        bars,
        ratios + against + [f"the machine's ceiling: {shown(r['machine_ceiling_efficiency'], '.2f')}"] + steps,
    )


def runs_chart(title: str, r: dict, name: str, ratio: Callable[[dict], str]) -> Chart:
    """Steady images/s of each run, named by its `name`; `ratio`'s line for each run after the first (the baseline)."""
    runs = r["runs"]
    return Chart(
        title,
        "steady images/s (higher is better)",
        [(run[name], run["images_per_sec"]) for run in runs],
        [ratio(run) for run in runs[1:]],
    )


def frameworks_chart(r: dict) -> Chart:
    """Steady images/s of each framework's trainer, one process each; each one's ratio to PyTorch's."""
    s = r["settings"]
    return runs_chart(
        f"each framework's trainer, one process: {s['model']}, {s['image_size']} px, batch {s['batch_size']}",
        r,
        "framework",
        lambda run: f"{run['framework']} against PyTorch, within each round: {shown(run['vs_pytorch'], '.2f')}x",
    )


def parallel_chart(r: dict) -> Chart:
    """Steady images/s of every layout; each one's memory against the data-parallel worker's."""
    s = r["settings"]
    return runs_chart(
        f"data-parallel against pipelines: {s['model']}, {s['image_size']} px, global batch {s['global_batch']}",
        r,
        "run",
        lambda run: (
            f"{run['run']}: {run['vs_data_parallel']:.2f}x the images/s, largest rank's training memory "
            f"{run['training_memory_vs_data_parallel']:.2f} of a data-parallel worker's"
        ),
    )


def flow_chart(r: dict) -> Chart:
    """Wall seconds of both commands and of the fixed cost's parts; the overhead."""
    s = r["settings"]
    return Chart(
        f"`trainflow run` against torchrun: {s['model']}, {s['workers']} workers, {s['epochs']} epochs",
        "wall seconds (lower is better)",
        list(r["seconds"].items()),
        [
            f"overhead of `trainflow run`: {shown(r['overhead_seconds'], '.1f')} s, "
            f"{shown(r['overhead_fraction'], '.0%')} of the direct run"
        ],
    )


def images_chart(r: dict) -> Chart:
    """Seconds of an unchanged rebuild and push, both ways, and the first build (once)."""
    cache = "no layer cache" if r["first_without_layer_cache"] else "the engine's layer cache"
    return Chart(
        "training image: build and push",
        "seconds, log scale (lower is better)",
        [
            (f"first build and push, once ({cache})", r["first_seconds"]),
            ("trainflow, unchanged context", r["trainflow_unchanged_seconds"]),
            ("docker build (layer cache) + docker push", r["docker_build_push_seconds"]),
        ],
        [f"unchanged context: trainflow {shown(r['speedup'], '.1f')}x faster than docker build + push"],
        log=True,
    )


def scale_chart(r: dict) -> Chart:
    """Microseconds per file of every stage at every size (one run each)."""
    bars = [
        (f"{stage}, {p['files']:,} files", s["seconds"] / p["files"] * 1e6)
        for p in r["points"]
        for stage, s in p["stages"].items()
    ]
    return Chart(
        "staging and training start-up as the data set grows (one run per size)",
        "µs per file, log scale (flat across sizes is the goal)",
        bars,
        [],
        log=True,
    )


def loader_label(name: str) -> str:
    """How a loader run is named: its --loader, and for the fast loader's second run the JPEGs it read."""
    base, _, side = name.partition("@")  # NAME@N: the loader on the JPEGs shrunk to an N px longer side
    label = "--loader fast, JPEGs with restart markers" if base == RESTARTS else f"--loader {base}"
    return f"{label}, shrunk to {side} px" if side else label


def loader_chart(r: dict) -> Chart:
    """Images/s per core of each loader on 1 core and on all; each loader's speed-up per core over pil."""
    bars = [
        (f"{loader_label(key.split('/')[0])}, {key.split('/')[1]} core(s)", f["per_core"])
        for key, f in r["runs"].items()
    ]
    return Chart(
        f"loaders on {r['images']} ImageNet-like JPEGs, random-resized-crop to {r['image_size']} px",
        "images/s per core (higher is better)",
        bars,
        [
            f"{loader} against pil, per core, {n} core(s): {shown(f, '.2f')}x"
            for loader, by_cores in r["speedup_per_core"].items()
            for n, f in by_cores.items()
        ],
    )


def install_chart(r: dict) -> Chart:
    """Wall seconds of each install (and of `make demo`); pip's time over uv's, and who ran it."""
    return Chart(
        f"installing, every cache empty, {r['cores']} cores",
        "wall seconds (lower is better)",
        [(NAMES[name], figure) for name, figure in r["seconds"].items()],
        lines(r)[-1:],
    )


def script_chart(r: dict) -> Chart:
    """The script's own images/s by hand and through `trainflow run --script`; the ratio, the fixed overhead and the
    uploads."""
    s = r["settings"]
    return Chart(
        f"your own script by hand and through `trainflow run --script`: {s['entry']} {' '.join(s['args'])}, "
        f"{s['workers']} workers ({s['launcher']})",
        "the script's own images/s (higher is better)",
        list(r["images_per_sec"].items()),
        script_lines(r),
    )


CHARTS = {
    "loader": loader_chart,
    "staging": staging_chart,
    "train": training_chart,
    "parallel": parallel_chart,
    "flow": flow_chart,
    "images": images_chart,
    "scale": scale_chart,
}
"""The charts of the benchmarks `trainflow bench all` runs."""
ALL_CHARTS = {**CHARTS, "frameworks": frameworks_chart, "install": install_chart, "script": script_chart}
"""And of those that run only alone (`trainflow bench frameworks`, `trainflow bench install`, `trainflow bench
script`)."""


def draw(chart: Chart, path: Path) -> None:
    """A horizontal bar per figure at its median, with a whisker from its min to its max, as an SVG."""
    figures = [figure_of(value) for _, value in chart.bars]
    medians = [f["median"] for f in figures]
    whiskers = [[m - f["min"] for m, f in zip(medians, figures)], [f["max"] - m for m, f in zip(medians, figures)]]
    fig, [ax] = new_figure(1, 1, size=(10, 0.45 * len(figures) + 1.4))
    ax.barh(range(len(figures)), medians, xerr=whiskers, color="#4c72b0", ecolor="#333333", capsize=3)
    ax.set_yticks(range(len(figures)), [label for label, _ in chart.bars])
    ax.invert_yaxis()
    ax.set_xscale("log" if chart.log else "linear")
    ax.set_xlabel(f"{chart.unit}\nbar: median; whisker: min to max", fontsize=9)
    ax.set_title(chart.title, fontsize=10)
    fig.tight_layout()
    save_svg(fig, path)


def section(name: str, chart: Chart, plot: Path) -> list[str]:
    """A benchmark's part of the report: heading, plot, table, ratios."""
    lines = [f"## {name}: {chart.title}", "", f"![{name}]({plot.name})", "", f"| what | {chart.unit} |", "|---|---|"]
    for label, value in chart.bars:
        figure = figure_of(value)
        lines.append(
            f"| {label} | {shown(figure, '.3g') if len(figure['all']) > 1 else format(figure['median'], '.3g')} |"
        )
    return lines + [""] + [f"- {ratio}" for ratio in chart.ratios] + [""]


def write_report(
    results: dict[str, dict], report: Path, command: str, machine: dict, title: str = "trainflow benchmarks"
) -> Path:
    """The markdown report of `results` (bench name -> its figures), measured on `machine` (benchmarks/common.py),
    at `report`, each plot an SVG beside it; `title` heads it."""
    unknown = sorted(set(results) - set(ALL_CHARTS))
    if unknown:
        raise ConfigError(f"no chart for benchmark {unknown[0]}: report one of {', '.join(ALL_CHARTS)}")
    lines = [f"# {title}", "", f"`{command}`", "", machine_line(machine), ""]
    lines += [
        "Every figure is the median (min-max) of the benchmark's repetitions unless it says once; ratios are "
        "computed within each round.",
        "",
    ]
    for name, result in results.items():
        chart = ALL_CHARTS[name](result)
        plot = report.with_name(f"{report.stem}-{name}.svg")
        draw(chart, plot)
        lines += section(name, chart, plot)
    report.write_text("\n".join(lines))
    return report


def machine_line(machine: dict) -> str:
    """Cores, memory, platform, Python and the versions that matter, on one line."""
    return (
        f"Machine: {machine['cores']} cores, {machine['memory_gb']} GB, {machine['platform']}, "
        f"Python {machine['python']}; versions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(machine["versions"].items()))
    )


DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def measured(data: dict, path: Path) -> dict:
    """A measurement's record of itself: date, bench (a single bench's JSON), command, title and notes."""
    entry = data.get("measured")
    if not entry or not {"date", "command", "title"} <= set(entry):
        raise ConfigError(
            f'{path} says nothing of when and how it was measured: add "measured": {{"date": "YYYY-MM-DD", '
            f'"command": ..., "title": ...}} (and "bench" for one bench\'s JSON) beside its "machine"'
        )
    return entry


def results_of(data: dict, entry: dict) -> dict[str, dict]:
    """bench name -> figures: `bench all` keeps them under "benches"; a single bench's JSON is its figures."""
    if "benches" in data:
        return data["benches"]
    return {entry["bench"]: {k: v for k, v in data.items() if k not in ("machine", "measured")}}


def dated_report(path: Path) -> Path:
    """The dated page of the measurement JSON at `path`: beside it, named after it, with its plots."""
    data = json.loads(path.read_text())
    entry = measured(data, path)
    report = write_report(
        results_of(data, entry), path.with_suffix(".md"), entry["command"], data["machine"], dated_title(entry)
    )
    notes = [f"- {note}" for note in entry.get("notes", [])]
    raw = f"The figures, every round of them: [{path.name}]({path.name})."
    head, body = report.read_text().split("\nEvery figure is", 1)
    report.write_text("\n".join([head, *notes, *([""] if notes else []), raw, "", "Every figure is" + body]))
    return report


def dated_title(entry: dict) -> str:
    return f"{entry['date']}: {entry['title']}"


def earlier_title(page: Path) -> str:
    """The title of a page of earlier measurements: its first heading."""
    return page.read_text().splitlines()[0].removeprefix("# ")


def write_index(folder: Path, entries: list[tuple[Path, dict]]) -> Path:
    """docs/benchmarks/index.md: every dated report, the newest first."""
    lines = [
        "# Benchmark reports",
        "",
        "One page per measurement, made from its JSON by `python -m benchmarks.report` (command, machine, versions, "
        "every figure with its spread, a plot per benchmark). What each benchmark measures: the concepts pages.",
        "",
        "Figures measured before their JSON was kept, each with its date and command as it was written:",
        "",
        *(f"- [{earlier_title(page)}]({page.name})" for page in sorted(folder.glob("earlier-*.md"))),
        "",
        "The test suite's own time (`make test`, by `python -m tests.timeline`: CONTRIBUTING says how):",
        "",
        *(f"- [{earlier_title(page)}]({page.name})" for page in sorted(folder.glob("suite-*.md"), reverse=True)),
        "",
        "| date | measurement | command |",
        "|---|---|---|",
    ]
    for path, entry in sorted(entries, key=lambda e: (e[1]["date"], e[0].name), reverse=True):
        lines.append(f"| {entry['date']} | [{entry['title']}]({path.with_suffix('.md').name}) | `{entry['command']}` |")
    index = folder / "index.md"
    index.write_text("\n".join(lines) + "\n")
    return index


def write_reports(folder: Path = DOCS) -> list[Path]:
    """A dated page for every measurement JSON in `folder`, and the index; the pages written."""
    entries = [(path, measured(json.loads(path.read_text()), path)) for path in sorted(folder.glob("*.json"))]
    pages = [dated_report(path) for path, _ in entries]
    return [*pages, write_index(folder, entries)]


if __name__ == "__main__":
    for page in write_reports(Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS):
        print(page)
