"""`trainflow bench script`: a training script of your own (containers/examples/horovod-synthetic, Horovod's synthetic
benchmark as Horovod's examples are written) through `trainflow run --script` against the same script launched by hand.

By hand is horovodrun with exactly the options trainflow gives it (infra/engines/launchers.py's `local_command`: Gloo
over lo, a 5 ms cycle time, `workers` local processes) and the variables trainflow gives every rank by default
(OMP_NUM_THREADS cores / workers, PYTHONUNBUFFERED): what a user who knows the machine would type. Both run a copy of
the example in the bench's folder, which also holds two files the script does not read (a folder of several files,
so that the upload after an edit can show it sends only the file that changed).

One `trainflow run --script` first uploads the scripts and is not measured; then `repeats` rounds of (by hand,
`trainflow run --script`), each with nothing changed, so every run of the flow is a second run: a new run (resume is
only for unfinished runs) whose scripts upload is skipped. Per round: the script's own `Total img/sec` line both ways
(their ratio), and the fixed overhead, the flow's wall seconds minus the by-hand launch's (the script's own run,
launcher included), also shown against the run's own run-training step (ledger.json). Last, one line of the copy's
train.py is changed and the flow runs once more: its upload-scripts step must upload exactly that one file.

The default size, batch 32 of 64 px images, makes a step about 60 ms on 2 cores: at the example's own defaults (batch
16 of 32 px) a step takes about 6 ms, close to Horovod's 5 ms cycle time, and its images/s measure how soon the
background thread wakes up, which any other process on the machine delays, more than the training.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from benchmarks import REPEATS
from benchmarks.common import bench_progress, shown, spread, write_json
from flows.config import FlowConfig
from infra.core.jsonfiles import read_json
from infra.engines.contract import PACKAGE
from infra.engines.launchers import LaunchError, local_command
from nodelib.cores import usable_cores

TRAINFLOW = str(Path(sys.executable).with_name("trainflow"))
EXAMPLE = PACKAGE.parent / "examples" / "horovod-synthetic"
ENTRY = "train.py"
LAUNCHER = "horovodrun"
# Beside the example's train.py in the bench's copy: files the script does not read, which each version ships too.
COMPANIONS = {
    "README.md": "The horovod-synthetic example, copied by `trainflow bench script`.\n",
    "settings/defaults.json": '{"note": "read by nothing: a second file the scripts version ships"}\n',
}
EDIT_MARK = "  # edited by trainflow bench script"
TOTAL = re.compile(r"Total img/sec on (\d+) CPU\(s\): ([0-9.]+) \+-([0-9.]+)")
RESULTS = re.compile(r"^results: (\S.*?)\s*$", re.M)
GOALS = {"throughput_ratio": 0.97, "overhead_seconds": 15.0, "files_uploaded_after_edit": 1}
# Wide enough that rich prints the step table's rows whole, one line each (the files column is read from it).
TABLE_COLUMNS = "400"


def bench_script(
    cfg: FlowConfig,
    json_out: Path | None,
    repeats: int = REPEATS,
    iterations: int = 10,
    batches_per_iter: int = 10,
    batch_size: int = 32,
    image_size: int = 64,
    workers: int = 2,
) -> dict:
    """After one unmeasured run, `repeats` rounds of the example by hand and by `trainflow run --script`, then one run
    after a one-line edit, in WORKDIR/bench/script; print and return the figures."""
    root = cfg.workdir.resolve() / "bench" / "script"
    shutil.rmtree(root, ignore_errors=True)
    source = copy_example(root / "scripts")
    args = ["--batch-size", str(batch_size), "--image-size", str(image_size), "--iterations", str(iterations)]
    args += ["--batches-per-iter", str(batches_per_iter)]
    flow = [TRAINFLOW, "run", "--workdir", str(root / "work"), "--script", str(source), "--launcher", LAUNCHER]
    flow += ["--workers", str(workers), "--", ENTRY, *args]
    by_hand = local_command(LAUNCHER, workers, [str(source / ENTRY), *args])
    rounds = []
    with bench_progress() as progress:
        bar = progress.add_task("trainflow run --script once, to upload the scripts (not measured)", total=2 + repeats)
        first = flow_run(flow)
        for repeat in range(repeats):
            progress.update(
                bar, advance=1, description=f"by hand, then trainflow run --script ({repeat + 1}/{repeats})"
            )
            rounds.append({"by hand": hand_run(by_hand, root / "by-hand", workers), "trainflow": flow_run(flow)})
        progress.update(bar, advance=1, description="trainflow run --script after a one-line edit")
        edit_one_line(source / ENTRY)
        edited = flow_run(flow)
        progress.update(bar, advance=1)
    settings = {
        "entry": ENTRY,
        "args": args,
        "workers": workers,
        "launcher": LAUNCHER,
        "by_hand": " ".join(Path(word).name if word.startswith("/") else word for word in by_hand),
        "by_hand_env": rank_defaults(workers),
        "files": 1 + len(COMPANIONS),
        "repeats": repeats,
    }
    result = summarise(rounds, first, edited, settings)
    print_script_bench(result)
    write_json(result, json_out)
    return result


def copy_example(folder: Path) -> Path:
    """The example copied to `folder` with the companion files beside it (the committed example is never edited)."""
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, text in COMPANIONS.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def rank_defaults(workers: int) -> dict[str, str]:
    """The variables trainflow gives every rank of a PyTorch script by default (infra/engines/script.py's
    `environment`): the by-hand launch gets them too."""
    return {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(max(1, usable_cores() // workers))}


def hand_run(argv: list[str], cwd: Path, workers: int) -> dict:
    """The script launched by hand: its wall seconds and its own images/s."""
    cwd.mkdir(parents=True, exist_ok=True)
    seconds, out = timed(argv, {**os.environ, **rank_defaults(workers)}, cwd)
    return {"seconds": seconds, "images_per_sec": total_rate(out)}


def flow_run(argv: list[str]) -> dict:
    """One `trainflow run --script`: its wall seconds, the script's images/s (from rank 0's log in the results
    folder), the run's id, its run-training step's seconds (ledger.json) and its upload-scripts row."""
    seconds, out = timed(argv, {**os.environ, "COLUMNS": TABLE_COLUMNS}, None)
    folder = results_folder(out)
    ledger = read_json(folder / "ledger.json") or {}
    return {
        "seconds": seconds,
        "images_per_sec": total_rate((folder / "logs" / "rank0.log").read_text()),
        "run_id": folder.name,
        "training_seconds": step_seconds(ledger, "run-training"),
        "steps": {row["step"]: row["seconds"] for row in ledger.get("steps", [])},
        "upload": step_row(out, "upload-scripts"),
    }


def timed(argv: list[str], env: dict[str, str], cwd: Path | None) -> tuple[float, str]:
    """Wall seconds of a whole command, which must succeed, and its output (stdout and stderr together)."""
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise LaunchError(
            f"{Path(argv[0]).name} {' '.join(argv[1:3])} ... failed (exit {done.returncode}): "
            f"{done.stdout.strip().splitlines()[-3:]}"
        )
    return seconds, done.stdout


def total_rate(text: str) -> float:
    """The images/s of the script's last `Total img/sec on N CPU(s): X +-Y` line (any prefix: `[rank 0] `, Horovod's
    `[0]<stdout>:`)."""
    found = TOTAL.findall(text)
    if not found:
        raise LaunchError("the script printed no `Total img/sec on N CPU(s): X +-Y` line")
    return float(found[-1][1])


def results_folder(text: str) -> Path:
    """The run's results folder, from the `results: PATH` line that `trainflow run --script` prints."""
    found = RESULTS.findall(text)
    if not found:
        raise LaunchError("trainflow run --script printed no `results: PATH` line")
    return Path(found[-1])


def step_row(text: str, step: str) -> dict[str, str]:
    """A step's row of the "what each step did" table `trainflow run` prints (rich's box lines, one line a row when
    the terminal is wide enough), by the table's own column names."""
    header = next((line for line in text.splitlines() if line.startswith("┃") and " step " in line), None)
    if header is None:
        raise LaunchError("trainflow run printed no step table")
    names = cells(header, "┃")
    for line in text.splitlines():
        if line.startswith("│") and cells(line, "│")[:1] == [step]:
            return dict(zip(names, cells(line, "│")))
    raise LaunchError(f"trainflow run's step table has no row {step} (is COLUMNS wide enough?)")


def cells(line: str, bar: str) -> list[str]:
    """The cells of one line of a rich table."""
    return [cell.strip() for cell in line.strip().strip(bar).split(bar)]


def step_seconds(ledger: dict, step: str) -> float | None:
    """A step's seconds in a run's ledger.json (None: the step is not there)."""
    return next((row["seconds"] for row in ledger.get("steps", []) if row["step"] == step), None)


def edited(text: str) -> str:
    """`text` with one line changed: a comment after its last line that holds anything."""
    lines = text.splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if line.strip())
    end = "\n" if lines[last].endswith("\n") else ""
    lines[last] = lines[last].rstrip("\n") + EDIT_MARK + end
    return "".join(lines)


def edit_one_line(path: Path) -> None:
    path.write_text(edited(path.read_text()))


def files_uploaded(row: dict[str, str]) -> int:
    """The files an upload-scripts row says it uploaded (0 for a skipped step)."""
    return int(row.get("files") or 0) if row.get("did") == "ran" else 0


def within(rounds: list[dict], figure: Callable[[dict], float]) -> dict:
    """A figure computed within each round, over the rounds."""
    return spread([figure(r) for r in rounds])


def summarise(rounds: list[dict], first: dict, edited_run: dict, settings: dict) -> dict:
    """Every figure over the rounds, each ratio and difference within its round; what the unmeasured first run and the
    run after the edit uploaded."""
    runs = [r["trainflow"] for r in rounds]
    return {
        "settings": settings,
        "images_per_sec": {
            "by hand": within(rounds, lambda r: r["by hand"]["images_per_sec"]),
            "trainflow run --script": within(rounds, lambda r: r["trainflow"]["images_per_sec"]),
        },
        "throughput_ratio": within(rounds, lambda r: r["trainflow"]["images_per_sec"] / r["by hand"]["images_per_sec"]),
        "seconds": {
            "by hand": within(rounds, lambda r: r["by hand"]["seconds"]),
            "trainflow run --script": within(rounds, lambda r: r["trainflow"]["seconds"]),
            "its run-training step": within(rounds, lambda r: r["trainflow"]["training_seconds"] or 0.0),
        },
        "overhead_seconds": within(rounds, lambda r: r["trainflow"]["seconds"] - r["by hand"]["seconds"]),
        "outside_training_seconds": within(
            rounds, lambda r: r["trainflow"]["seconds"] - (r["trainflow"]["training_seconds"] or 0.0)
        ),
        "step_seconds": {step: spread([run["steps"].get(step, 0.0) for run in runs]) for step in runs[0]["steps"]},
        "outside_steps_seconds": within(
            rounds, lambda r: r["trainflow"]["seconds"] - sum(r["trainflow"]["steps"].values())
        ),
        "new_run_each_time": len({run["run_id"] for run in [first, *runs, edited_run]}) == len(runs) + 2,
        "uploads": {
            "first run": first["upload"],
            "unchanged runs": [run["upload"] for run in runs],
            "after a one-line edit": edited_run["upload"],
        },
        "files_uploaded_after_edit": files_uploaded(edited_run["upload"]),
        "edited_run_seconds": edited_run["seconds"],
        "goals": GOALS,
    }


def script_lines(r: dict) -> list[str]:
    """The figures against their goals, the seconds behind the overhead and what each upload did, one line each."""
    s, goals, uploads = r["settings"], r["goals"], r["uploads"]
    skipped = sum(row.get("did") == "skipped" for row in uploads["unchanged runs"])
    seconds = ", ".join(f"{what} {shown(figure, '.1f')} s" for what, figure in r["seconds"].items())
    steps = ", ".join(f"{step} {shown(figure, '.1f')} s" for step, figure in r["step_seconds"].items())
    return [
        f"throughput through `trainflow run --script` against by hand, within each round: "
        f"{shown(r['throughput_ratio'], '.3f')} (goal ≥ {goals['throughput_ratio']})",
        f"fixed overhead of an unchanged `trainflow run --script`, its wall time minus the by-hand launch's: "
        f"{shown(r['overhead_seconds'], '.1f')} s (goal ≤ {goals['overhead_seconds']:.0f} s); minus its own "
        f"run-training step: {shown(r['outside_training_seconds'], '.1f')} s",
        f"wall seconds: {seconds}",
        f"of an unchanged run's wall time, its steps (ledger.json): {steps}; outside them (imports, Prefect's server, "
        f"Azurite, the tasks the ledger does not list): {shown(r['outside_steps_seconds'], '.1f')} s",
        f"upload-scripts of the unchanged runs: skipped in {skipped} of {len(uploads['unchanged runs'])}; "
        f"a new run each time: {'yes' if r['new_run_each_time'] else 'no'}",
        f"upload-scripts after a one-line edit of {s['entry']} ({s['files']} files in the folder): "
        f"{r['files_uploaded_after_edit']} file(s) uploaded (goal {goals['files_uploaded_after_edit']}); "
        f"its step said: {uploads['after a one-line edit'].get('why', '')}; once, {r['edited_run_seconds']:.1f} s",
    ]


def print_script_bench(result: dict) -> None:
    s = result["settings"]
    console = Console(highlight=False, soft_wrap=True)
    console.print(
        f"[bold]{s['entry']} {' '.join(s['args'])}[/], {s['workers']} workers ({s['launcher']}), median (min-max) of "
        f"{s['repeats']} rounds; by hand: {' '.join(f'{k}={v}' for k, v in s['by_hand_env'].items())} {s['by_hand']}"
    )
    for what, figure in result["images_per_sec"].items():
        console.print(f"images/s, {what}: {shown(figure, '.0f')}")
    for line in script_lines(result):
        console.print(line)
