"""`trainflow bench gpu`: ResNet-50 images/s per GPU in bf16 on synthetic data and on real JPEGs through each loader,
with the share of each step spent waiting for data and the model FLOPs utilisation (MFU, benchmarks/gpu_plan.py).

The runs (gpu_plan): synthetic data eager and compiled; photo-like JPEGs of ImageNet's sizes (gpu_plan.PHOTOS,
infra/data/photos.py) through each loader installed here (gpu, fast, pil; dali where installed), the fast loader
once more on their copy with restart markers (where jpeg_crop can rewrite them), the gpu and fast loaders on their
copy shrunk to a 500 px longer side (infra/data/shrink.py); then the model step's variants on synthetic data
(torch.compile's modes, the optimizer unfused). One process on GPU 0, through the process pool as `trainflow train`
runs it; REPEATS rounds of every run, every figure the median with its min-max. `--quick` runs the device check
instead (benchmarks/device_check.py: one round, the trainer alone, within 8 minutes). On a machine without a CUDA
GPU it says so and exits 2.
"""

import shlex
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import REPEATS
from benchmarks.common import (
    RESTARTS,
    bench_progress,
    clear_checkpoints,
    over_defaults,
    run_ended,
    shown,
    spread,
    steady_rate,
    write_json,
)
from benchmarks.device_check import BUDGET_S, Check, measure_on_gpu
from benchmarks.gpu_plan import (
    JPEGS,
    MODEL_STEP_RUNS,
    PHOTOS,
    SHRUNK,
    SYNTHETIC,
    SYNTHETIC_RUNS,
    TRAINER_DEFAULTS,
    Run,
    gpu_facts,
    installed_loaders,
    loader_run,
    mfu,
    peak_tflops,
    photo_folders,
    write_photo_set,
    write_shrunk_copy,
)
from benchmarks.loader import restart_marked_copy, training_split
from flows.config import ConfigError, FlowConfig
from infra.compute.process import train_here
from nodelib.cores import usable_cores
from trainer import jpeg_crop
from trainer.dali import INSTALL
from trainer.options import LOADERS

GPU_DEFAULTS = TRAINER_DEFAULTS | {"workers": 1}  # one process: the orchestrator's setting


def the_gpu() -> dict:
    """gpu_plan.gpu_facts, or an error saying there is no CUDA GPU here."""
    if facts := gpu_facts():
        return facts
    raise ConfigError(
        "no CUDA GPU here (torch.cuda.is_available() is False): `trainflow bench gpu` measures "
        "images/s per GPU; run it on a machine with an NVIDIA GPU and its driver"
    )


def runs(loaders: tuple[str, ...], restarts: bool) -> list[Run]:
    """Every run: synthetic data eager and compiled, the JPEGs through each of `loaders` (after the fast loader,
    where `restarts`, the fast loader on their copy with restart markers), the gpu and fast loaders (those of
    `loaders`) on the shrunk copy, then the model step's variants."""
    jpegs = [loader_run(name) for name in loaders]
    if restarts and "fast" in loaders:
        marked = loader_run("fast")._replace(label=f"JPEGs, --loader {RESTARTS}", data=RESTARTS)
        jpegs.insert(loaders.index("fast") + 1, marked)
    shrunk = [loader_run(name, SHRUNK) for name in ("gpu", "fast") if name in loaders]
    return [*SYNTHETIC_RUNS, *jpegs, *shrunk, *MODEL_STEP_RUNS]


def check_loaders(loaders: list[str]) -> None:
    """Refuse a loader the trainer lacks, or one not installed here, before any run (not after the first)."""
    if unknown := sorted(set(loaders) - set(LOADERS)):
        raise ConfigError(f"--loader {unknown[0]} is not a loader: pass one of {', '.join(LOADERS)}")
    if missing := sorted(set(loaders) - set(installed_loaders())):
        raise ConfigError(
            f"--loader {missing[0]} needs NVIDIA DALI, which is not installed here: {INSTALL}, or leave "
            "--loader out (every loader installed here)"
        )


def bench_gpu(
    cfg: FlowConfig,
    json_out: Path | None,
    loaders: tuple[str, ...] = (),
    given_peak: float | None = None,
    repeats: int = REPEATS,
    quick: bool = False,
) -> dict:
    """Every run `repeats` rounds on GPU 0 (the JPEGs through `loaders`, by default every loader installed here),
    or with `quick` the device check; print the table and return the figures."""
    gpu, root = the_gpu(), cfg.workdir.resolve() / "bench" / "gpu"
    if quick:
        return quick_check(root, json_out, given_peak)
    base = over_defaults(GPU_DEFAULTS, cfg.training)
    plan = runs(tuple(loaders) or installed_loaders(), jpeg_crop.library() is not None)
    folders = run_data(root, {run.data for run in plan})
    peak = peak_tflops(gpu["name"], given_peak)
    head = {"gpu": gpu, "peak_bf16_tflops": peak, "settings": base.model_dump() | {"repeats": repeats}}
    facts: dict[str, list[tuple[float, float]]] = {run.label: [] for run in plan}
    with bench_progress() as progress:
        bar = progress.add_task("GPU benchmark", total=repeats * len(plan))
        ended = run_ended(progress, bar)
        for repeat in range(repeats):
            for run in plan:
                progress.update(bar, description=f"{run.label} ({repeat + 1}/{repeats})")
                started = time.perf_counter()
                rate, wait = one_run(base.model_copy(update=run.settings), folders[run.data], root, run.label)
                facts[run.label].append((rate, wait))
                ended(
                    f"{run.label} ({repeat + 1}/{repeats}): {rate:.0f} images/s, data-wait share {wait:.2f} "
                    f"(the run took {time.perf_counter() - started:.0f} s)"
                )
                write_json(head | measured(plan, facts, peak, False), json_out)  # a bench stopped later keeps these
    result = head | measured(plan, facts, peak, True)
    print_gpu_bench(result)
    write_json(result, json_out)
    return result


def quick_check(root: Path, json_out: Path | None, given_peak: float | None) -> dict:
    """The device check on this GPU (one round of its runs, each by the trainer alone, within its 8 minutes), its
    folders under `root`: its record, also written to `json_out`."""
    check = Check(root / "device-check", root, BUDGET_S, given_peak, shlex.join(["trainflow", *sys.argv[1:]]))
    measure_on_gpu(check)
    check.finish()
    write_json(check.record, json_out)
    return check.record


def one_run(training, data: str, root: Path, label: str) -> tuple[float, float]:
    """One training from scratch in the run's folder under `root`: its steady images/s and its largest rank's
    data-wait share."""
    out = root / label.replace(" ", "-").replace(",", "")
    clear_checkpoints(out)
    metrics = train_here(training, data, out, root / "pools", lambda line: None)
    return steady_rate(metrics), max(metrics.data_wait_share or [0.0])


def measured(plan: list[Run], facts: dict, peak: float | None, complete: bool) -> dict:
    """Whether every round ran, and the figures of each run measured so far."""
    return {"complete": complete, "runs": [gpu_row(r.label, facts[r.label], peak) for r in plan if facts[r.label]]}


def run_data(root: Path, needed: set[str]) -> dict[str, str]:
    """What each kind of run trains on: synthetic data, the photo-like JPEGs (written once), their copy shrunk to
    MAX_SIDE and their copy with restart markers (each made once, where a run needs it)."""
    cores, folders = usable_cores(), photo_folders(root, PHOTOS)
    write_photo_set(folders[JPEGS], PHOTOS, cores)
    found = {SYNTHETIC: SYNTHETIC, JPEGS: str(folders[JPEGS])}
    if SHRUNK in needed:
        write_shrunk_copy(folders[JPEGS], folders[SHRUNK], cores)
        found[SHRUNK] = str(folders[SHRUNK])
    if RESTARTS in needed:
        found[RESTARTS] = str(restart_marked_copy(folders[JPEGS], training_split(folders[JPEGS]), root))
    return found


def gpu_row(label: str, measured: list[tuple[float, float]], peak: float | None) -> dict:
    """One run's images/s, data-wait share and MFU over its repetitions."""
    rates = [rate for rate, _ in measured]
    return {
        "run": label,
        "images_per_sec": spread(rates),
        "data_wait_share": spread([wait for _, wait in measured]),
        "mfu": spread([mfu(rate, peak) for rate in rates]) if peak else None,
    }


def print_gpu_bench(result: dict) -> None:
    """The runs as a table: medians, min-max in brackets."""
    g, s = result["gpu"], result["settings"]
    table = Table(
        title=f"{s['model']} {s['precision']} on {g['name']} (driver {g['driver']}, CUDA {g['cuda']}), batch "
        f"{s['batch_size']}, steady images/s, median (min-max) of {s['repeats']} rounds"
    )
    for column in ("run", "images/s", "data-wait share", "MFU"):
        table.add_column(column, justify="right")
    for r in result["runs"]:
        table.add_row(
            r["run"],
            shown(r["images_per_sec"], ".0f"),
            shown(r["data_wait_share"], ".2f"),
            shown(r["mfu"], ".1%") if r["mfu"] else "unknown peak: pass --peak-tflops",
        )
    Console().print(table)
