"""`trainflow bench gpu`: ResNet-50 images/s per GPU in bf16 on synthetic data and on real JPEGs through each loader,
with the share of each step spent waiting for data and the model FLOPs utilisation (MFU).

MFU = images/s x 24.3 GFLOP (ResNet-50's forward and backward pass per 224 px image) / the GPU's peak dense bf16
FLOP/s, from the table below (NVIDIA's datasheets) or `--peak-tflops`. One process on GPU 0; REPEATS rounds of every
run, every figure the median with its min-max. On a machine without a CUDA GPU it says so and exits 2.
"""

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import overload

import torch
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
from benchmarks.loader import installed_loaders, restart_marked_copy, training_split
from flows.config import ConfigError, FlowConfig
from infra.compute.process import train_here
from infra.data.sample_data import write_imagenet_like
from trainer import jpeg_crop
from trainer.dali import INSTALL
from trainer.options import LOADERS

RESNET50_TRAIN_GFLOP = 24.3  # per image, forward + backward (3 x the forward's ~8.1 GFLOP at 224 px)
# Dense bf16 tensor-core peak, TFLOP/s, by the name torch.cuda.get_device_name() gives (NVIDIA datasheets).
PEAK_BF16_TFLOPS = {
    "H200": 989.4,
    "H100 80GB HBM3": 989.4,
    "H100 SXM": 989.4,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.5,
    "A100": 312.0,
    "L40S": 362.1,
    "L4": 121.0,
    "A10": 125.0,
}
GPU_DEFAULTS = dict(
    model="resnet50",
    image_size=224,
    batch_size=256,
    precision="bf16",
    channels_last="on",
    device="cuda",
    epochs=2,
    steps_per_epoch=30,
    warmup_epochs=0,
    checkpoint_every=0,
    log_every=10,
    workers=1,
)
JPEGS = 20_000


def peak_tflops(name: str, given: float | None) -> float | None:
    """The GPU's peak dense bf16 TFLOP/s: `given`, else the table's entry whose key the device name contains."""
    if given:
        return given
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


@overload
def mfu(images_per_sec: float, peak: float) -> float: ...
@overload
def mfu(images_per_sec: float, peak: None) -> None: ...
def mfu(images_per_sec: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation of ResNet-50 training at `images_per_sec` on a GPU of `peak` TFLOP/s."""
    return images_per_sec * RESNET50_TRAIN_GFLOP * 1e9 / (peak * 1e12) if peak else None


def gpu_facts() -> dict:
    """GPU 0's name and memory, the driver's version (nvidia-smi) and CUDA's; an error when there is no GPU."""
    if not torch.cuda.is_available():
        raise ConfigError(
            "no CUDA GPU here (torch.cuda.is_available() is False): `trainflow bench gpu` measures "
            "images/s per GPU; run it on a machine with an NVIDIA GPU and its driver"
        )
    props = torch.cuda.get_device_properties(0)
    smi = shutil.which("nvidia-smi")
    driver = (
        subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True)
        .stdout.strip()
        .splitlines()[0]
        if smi
        else "unknown"
    )
    return {
        "name": props.name,
        "memory_gb": round(props.total_memory / 2**30, 1),
        "driver": driver,
        "cuda": torch.version.cuda,
        "count": torch.cuda.device_count(),
    }


def runs(loaders: tuple[str, ...], restarts: bool) -> list[tuple[str, str, dict]]:
    """(label, data, trainer settings) of every run: synthetic data eager and compiled (whether torch.compile
    helps decided its default, on for a GPU), then the JPEGs through each loader with the default, and where
    `restarts` (jpeg_crop can rewrite them) the fast loader once more on the JPEGs with restart markers."""
    jpegs = [(f"JPEGs, --loader {name}", "jpegs", {"loader": name}) for name in loaders]
    if restarts and "fast" in loaders:
        jpegs.insert(loaders.index("fast") + 1, (f"JPEGs, --loader {RESTARTS}", RESTARTS, {"loader": "fast"}))
    return [
        ("synthetic, --compile off", "synthetic", {"loader": loaders[0], "compile": "off"}),
        ("synthetic, --compile on", "synthetic", {"loader": loaders[0], "compile": "on"}),
    ] + jpegs


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
) -> dict:
    """Every run `repeats` rounds on GPU 0 (the JPEGs through `loaders`, by default every loader installed here);
    print the table and return the figures."""
    gpu = gpu_facts()
    base = over_defaults({**GPU_DEFAULTS, "loader_workers": max(1, len(os.sched_getaffinity(0)) - 1)}, cfg.training)
    root = cfg.workdir.resolve() / "bench" / "gpu"
    plan = runs(tuple(loaders) or installed_loaders(), jpeg_crop.library() is not None)
    folders = run_data(root, {data for _, data, _ in plan})
    peak = peak_tflops(gpu["name"], given_peak)
    head = {"gpu": gpu, "peak_bf16_tflops": peak, "settings": base.model_dump() | {"repeats": repeats}}
    facts: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in plan}
    with bench_progress() as progress:
        bar = progress.add_task("GPU benchmark", total=repeats * len(plan))
        ended = run_ended(progress, bar)
        for repeat in range(repeats):
            for label, data, settings in plan:
                progress.update(bar, description=f"{label} ({repeat + 1}/{repeats})")
                started = time.perf_counter()
                rate, wait = one_run(base.model_copy(update=settings), folders[data], root, label)
                facts[label].append((rate, wait))
                ended(
                    f"{label} ({repeat + 1}/{repeats}): {rate:.0f} images/s, data-wait share {wait:.2f} "
                    f"(the run took {time.perf_counter() - started:.0f} s)"
                )
                write_json(head | measured(plan, facts, peak, False), json_out)  # a bench stopped later keeps these
    result = head | measured(plan, facts, peak, True)
    print_gpu_bench(result)
    write_json(result, json_out)
    return result


def one_run(training, data: str, root: Path, label: str) -> tuple[float, float]:
    """One training from scratch in the run's folder under `root`: its steady images/s and its largest rank's
    data-wait share."""
    out = root / label.replace(" ", "-").replace(",", "")
    clear_checkpoints(out)
    metrics = train_here(training, data, out, root / "pools", lambda line: None)
    return steady_rate(metrics), max(metrics.data_wait_share or [0.0])


def measured(plan: list[tuple[str, str, dict]], facts: dict, peak: float | None, complete: bool) -> dict:
    """Whether every round ran, and the figures of each run measured so far."""
    return {"complete": complete, "runs": [gpu_row(label, facts[label], peak) for label, _, _ in plan if facts[label]]}


def run_data(root: Path, needed: set[str]) -> dict[str, str]:
    """What each kind of run trains on: "synthetic", the generated JPEGs, their copy with restart markers."""
    jpegs = write_imagenet_like(root / "jpegs", files=JPEGS, classes=100)
    folders = {"synthetic": "synthetic", "jpegs": str(jpegs)}
    if RESTARTS in needed:
        folders[RESTARTS] = str(restart_marked_copy(jpegs, training_split(jpegs), root))
    return folders


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
