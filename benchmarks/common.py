"""What every benchmark shares: fresh outputs, timing, repetitions, counting, quiet logs, the JSON file."""

import platform
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psutil
from rich.progress import Progress, TaskID, TimeElapsedColumn

from infra.core.errors import BadInput
from infra.core.jsonfiles import write_json as keep_json
from infra.engines import ENGINES, TrainingConfig
from infra.engines.contract import Metrics, TrainingSettings
from infra.engines.launchers import LaunchError
from infra.engines.pytorch import PyTorchTraining
from nodelib.cores import usable_cores
from trainer.metrics import installed_versions, library_versions

RESTARTS = "fast+restarts"  # bench loader's run of the fast loader on the JPEGs rewritten with restart markers


def over_defaults(defaults: dict, training: TrainingSettings) -> PyTorchTraining:
    """`defaults` for every training setting the config file and environment left unset (only those named stay
    set, so that a bench called with the result applies its own defaults to the rest). The benchmarks measure the
    PyTorch trainer."""
    if training.framework != "pytorch":
        raise BadInput(f"the benchmarks measure the PyTorch trainer; training.framework is {training.framework}")
    return PyTorchTraining(**{**defaults, **training.model_dump(include=training.model_fields_set)})


def as_framework(defaults: dict, training: TrainingSettings, framework: str) -> TrainingConfig:
    """`defaults` and the settings the config names, as `framework`'s section (for the benches that compare
    frameworks: the bench picks the framework and the launcher; a setting `framework` has not is left out)."""
    if framework not in ENGINES:
        raise BadInput(f"--framework {framework} is not a framework: pass one of {', '.join(ENGINES)}")
    engine = ENGINES[framework]
    named = training.model_dump(include=training.model_fields_set - {"framework", "launcher"})
    return engine(**{**defaults, **{k: v for k, v in named.items() if k in engine.model_fields}})


def steady_rate(metrics: Metrics) -> float:
    """A benchmark run's steady images/s (its last epoch after the first step), which it must have measured."""
    if metrics.steady_images_per_sec is None:
        raise LaunchError("the run measured no steady images/s: its last epoch had one step; give it more steps")
    return metrics.steady_images_per_sec


def clear_checkpoints(out: Path) -> None:
    """A benchmark run starts fresh: an earlier run's checkpoints would be resumed otherwise."""
    shutil.rmtree(out / "checkpoints", ignore_errors=True)


def time_call(fn) -> float:
    """Seconds that fn() takes."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def spread(values: list[float]) -> dict:
    """The median of repeated measurements with their smallest and largest."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def shown(figure: dict, fmt: str) -> str:
    """median (min-max)."""
    return f"{figure['median']:{fmt}} ({figure['min']:{fmt}}–{figure['max']:{fmt}})"


def bench_progress() -> Progress:
    """The progress bar every bench shows: the default columns and the time elapsed."""
    return Progress(*Progress.get_default_columns(), TimeElapsedColumn())


def run_ended(progress: Progress, bar: TaskID) -> Callable[[str], None]:
    """Print a run's figure above the bar as the run ends (a bench stopped by a time limit keeps what it printed) and
    move the bar on."""

    def said(line: str) -> None:
        progress.console.print(line, soft_wrap=True)  # one line, whatever the width: grep finds it
        progress.advance(bar)

    return said


def machine() -> dict:
    """What the figures were measured on: cores, memory, the platform and the versions that matter (the trainer's
    record of its own, and the orchestrator's)."""
    versions = {**library_versions(), **installed_versions("prefect", "azure-storage-blob")}
    return {
        "cores": usable_cores(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
    }


def count_files(folder: Path) -> tuple[int, int]:
    """Files under a folder and their total size."""
    sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file()]
    return len(sizes), sum(sizes)


def log_quietly(line: str) -> None:
    """Build output: only the step headers and the push's layer lines, so progress stays readable."""
    if line.startswith(("Step ", "pushing", "pushed", "building")):
        print(line, flush=True)


def write_json(result: dict, json_out: Path | None) -> None:
    """The figures as JSON, with the machine they were measured on and the record of when and how (what
    benchmarks/report.py makes a dated report of), when asked for; written whole (a bench that writes it after every
    run and is stopped leaves the last whole file)."""
    if json_out:
        keep_json(json_out, {**result, "machine": machine(), "measured": how_measured(sys.argv[1:])}, indent=2)


def how_measured(args: list[str]) -> dict:
    """The "measured" entry of a bench's JSON: today's date (UTC), the command as typed, a title, and the bench's
    name for a single bench (`bench all` keeps its figures under "benches")."""
    bench = args[1] if args[:1] == ["bench"] and len(args) > 1 else "bench"
    entry = {"date": f"{datetime.now(UTC):%Y-%m-%d}", "command": shlex.join(["trainflow", *args])}
    return entry | {"title": f"trainflow bench {bench}"} | ({} if bench == "all" else {"bench": bench})
