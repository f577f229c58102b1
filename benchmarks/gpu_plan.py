"""What the GPU benchmarks share: the runs they make, the data those train on, the facts they record and the MFU.

`trainflow bench gpu` (benchmarks/gpu.py) makes these runs through the orchestrator's process pool, repeated; the
device check (benchmarks/device_check.py) makes them with the trainer alone, each on a time budget, on a lent GPU
machine that has no network and no project venv: so this module imports only the standard library, torch,
torchvision, Pillow, numpy, the trainer and infra/data's pure modules (photos.py, shrink.py's workers).

MFU = images/s x 24.3 GFLOP (ResNet-50's forward and backward pass per 224 px image) / the GPU's peak dense bf16
FLOP/s, from the table below (NVIDIA's datasheets) or `--peak-tflops`.
"""

import functools
import importlib.util
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple, overload

import numpy
import PIL
import torch
import torchvision

from infra.data.photos import make_photo_folders, photo_plan, write_photo
from infra.data.restart_markers import ALREADY, REWRITTEN, Outcome, rewrite_files
from infra.data.shrink import mirror_files
from nodelib.cores import usable_cores
from trainer import gpu_decode, jpeg_crop
from trainer.data import LOADERS, train_transform
from trainer.options import build_parser

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
# The trainer's settings of every run (each run sets a few more): ResNet-50 at 224 px, bf16, channels-last, batch
# 256 on GPU 0; two epochs, the second measured (the first compiles and fills the page cache); no warmup, a
# checkpoint at each epoch end only.
TRAINER_DEFAULTS = dict(
    model="resnet50",
    image_size=224,
    batch_size=256,
    precision="bf16",
    channels_last="on",
    device="cuda",
    epochs=2,
    steps_per_epoch=40,
    warmup_epochs=0,
    checkpoint_every=0,
    log_every=10,
)
PHOTOS = 10_240  # 40 batches of 256: an epoch of a JPEG run reads each file once
PHOTO_CLASSES = 1000  # as ImageNet and synthetic data have: the same model, so the compiled graph is found cached
MAX_SIDE = 500  # the shrunk copy's longer side: FFCV's for ResNet-50 on ImageNet
SYNTHETIC, JPEGS, SHRUNK, MARKED = "synthetic", "jpegs", "shrunk", "marked"  # what a run trains on
DATA_LABELS = {JPEGS: "JPEGs", SHRUNK: f"JPEGs shrunk to {MAX_SIDE} px", MARKED: "JPEGs with restart markers"}
SHRINK_CHUNK = 64  # files per unit of work of the shrinking processes


class Run(NamedTuple):
    """One training run of a GPU benchmark."""

    label: str
    data: str
    """SYNTHETIC, JPEGS, SHRUNK, MARKED (or benchmarks.common.RESTARTS, bench gpu's own)."""
    settings: dict
    """The trainer's settings over TRAINER_DEFAULTS, by option name (compile_mode for --compile-mode)."""
    budget_s: float
    """The device check's limit on it: the trainer's start, its compiling (cached after the first compiled run of the
    same graph) and two epochs."""


SYNTHETIC_RUNS = (
    Run("synthetic, --compile off", SYNTHETIC, {"compile": "off"}, 60),
    Run("synthetic, --compile on", SYNTHETIC, {"compile": "on"}, 120),  # the first to compile: nothing cached
)
# The model step itself, on synthetic data: torch.compile's modes (reduce-overhead replays the step as CUDA graphs;
# max-autotune-no-cudagraphs tries Triton kernels for each convolution: minutes of autotuning), and the optimizer
# unfused (the trainer fuses SGD's update on CUDA by default, --fused-optimizer auto: this run is what that buys).
MODEL_STEP_RUNS = (
    Run(
        "synthetic, --compile-mode reduce-overhead", SYNTHETIC, {"compile": "on", "compile_mode": "reduce-overhead"}, 90
    ),
    Run("synthetic, --fused-optimizer off", SYNTHETIC, {"compile": "on", "fused_optimizer": "off"}, 60),
    Run(
        "synthetic, --compile-mode max-autotune-no-cudagraphs",
        SYNTHETIC,
        {"compile": "on", "compile_mode": "max-autotune-no-cudagraphs"},
        240,
    ),
)


def loader_run(loader: str, data: str = JPEGS, budget_s: float = 50) -> Run:
    """A run of `loader` on the JPEGs (or a copy of them), compiled as a GPU's default is, with the loader workers
    the trainer picks (--loader-workers auto, as users run it); its budget is the trainer's start and two epochs with
    the compiled model found cached (the synthetic compiled run before it compiles the same graph): a run that had to
    compile afresh is stopped at it, and says so."""
    return Run(f"{DATA_LABELS[data]}, --loader {loader}", data, {"loader": loader, "compile": "on"}, budget_s)


def device_check_runs() -> list[Run]:
    """The device check's runs, most wanted first: synthetic compiled (the goal's yardstick, and the compile that the
    later runs find cached), the GPU loader and the fast one on the JPEGs, the fast one on the shrunk copy, DALI on
    the JPEGs (skipped where it is not installed), then the model-step variants where time is left. The fast
    loader also reads the JPEGs rewritten with restart markers (full size: `trainflow data add-restart-markers`), so
    that it decodes only each crop's MCUs."""
    fast = [loader_run("fast"), loader_run("fast", MARKED), loader_run("fast", SHRUNK)]
    jpegs = [loader_run("gpu"), *fast, loader_run("dali")]
    return [SYNTHETIC_RUNS[1], *jpegs, *MODEL_STEP_RUNS]


def trainer_lacks(settings: dict) -> str:
    """Why this checkout's trainer cannot take `settings` ('' when it can): an option it does not have, or a value
    outside the option's choices. A run for an option still to come is skipped with this, not failed."""
    options = {action.dest: action for action in build_parser()._actions}  # argparse lists them nowhere else
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        if name not in options:
            return f"this trainer has no {flag}"
        if (choices := options[name].choices) and value not in choices:
            return f"this trainer's {flag} takes {', '.join(map(str, choices))}, not {value}"
    if settings.get("loader") == "dali" and "dali" not in installed_loaders():
        return "NVIDIA DALI is not installed here (pip install 'trainflow[dali]')"
    return ""


def installed_loaders() -> tuple[str, ...]:
    """The trainer's loaders that can run here: dali only where NVIDIA DALI is installed."""
    return tuple(loader for loader in LOADERS if loader != "dali" or importlib.util.find_spec("nvidia.dali"))


def trainer_argv(settings: dict) -> list[str]:
    """The trainer's options for `settings` (by option name), in order."""
    return [arg for name, value in settings.items() for arg in ("--" + name.replace("_", "-"), str(value))]


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


def gpu_facts() -> dict | None:
    """GPU 0's name and memory, the driver's version (nvidia-smi) and CUDA's; None when there is no CUDA GPU."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "memory_gb": round(props.total_memory / 2**30, 1),
        "driver": driver_version(),
        "cuda": torch.version.cuda,
        "count": torch.cuda.device_count(),
    }


def driver_version() -> str:
    """The NVIDIA driver's version as nvidia-smi reports it; "unknown" without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "unknown"
    said = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True)
    return (said.stdout.strip().splitlines() or ["unknown"])[0]


def software_facts() -> dict:
    """What the figures were measured with: the date, the machine's cores and Python, the libraries' versions, and
    whether the fast loader decodes only the crop (jpeg_crop.c built: it needs cc and libjpeg's headers)."""
    return {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "cores": usable_cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "pillow": PIL.__version__,
        "numpy": numpy.__version__,
        "cuda": torch.version.cuda,
        "partial_jpeg_decoding": not jpeg_crop.unavailable(),
        "partial_jpeg_decoding_off_because": jpeg_crop.unavailable() or None,
    }


def photo_folders(work: Path, files: int) -> dict[str, Path]:
    """Where the photo-like JPEGs (JPEGS), their shrunk copy (SHRUNK) and their copy with restart markers (MARKED)
    are kept under `work`."""
    return {
        JPEGS: work / f"photos-{files}",
        SHRUNK: work / f"photos-{files}-shrunk",
        MARKED: work / f"photos-{files}-marked",
    }


def write_photo_set(dest: Path, files: int, workers: int) -> dict:
    """`files` photo-like JPEGs of ImageNet's sizes in dest/train (PHOTO_CLASSES classes), written by `workers`
    processes once (a folder already there is kept); its files, bytes and the seconds writing took."""
    started = time.perf_counter()
    if not (dest / "train").is_dir():
        partial = dest.with_name(f".{dest.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        photos = photo_plan(files, PHOTO_CLASSES)
        make_photo_folders(partial, photos)
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            sizes = list(pool.imap_unordered(functools.partial(write_photo, str(partial), 0), photos, chunksize=8))
        os.replace(partial, dest)
    else:
        sizes = [p.stat().st_size for p in (dest / "train").rglob("*.JPEG")]
    return {"files": len(sizes), "bytes": sum(sizes), "seconds": round(time.perf_counter() - started, 1)}


def write_shrunk_copy(src: Path, dest: Path, workers: int) -> dict:
    """src's JPEGs whose longer side exceeds MAX_SIDE re-encoded at it in `dest`, the others linked (shrink.py's
    mirror, by `workers` processes); the files shrunk, the bytes before and after, and the seconds it took."""
    started = time.perf_counter()
    paths = sorted(str(p.relative_to(src)) for p in src.rglob("*.JPEG"))
    chunks = [paths[i : i + SHRINK_CHUNK] for i in range(0, len(paths), SHRINK_CHUNK)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        done = [o for chunk in pool.imap_unordered(functools.partial(mirror, src, dest), chunks) for o in chunk]
    return {
        "max_side": MAX_SIDE,
        "files": len(done),
        "shrunk": sum(o.kind == "shrunk" for o in done),
        "bytes_before": sum(o.source for o in done),
        "bytes_after": sum(o.mirror for o in done),
        "seconds": round(time.perf_counter() - started, 1),
    }


def write_marked_copy(src: Path, dest: Path, workers: int) -> dict:
    """A copy of src's JPEGs rewritten losslessly with a restart marker after every MCU (infra/data/restart_markers.py,
    by `workers` processes), made once (a folder already there is kept); the files rewritten, the bytes before and
    after, and the seconds it took. Where the fast loader cannot be built here (no cc or libjpeg), nothing: why."""
    if jpeg_crop.library() is None:
        raise RuntimeError(f"no restart markers can be written here: {jpeg_crop.unavailable()}")
    started = time.perf_counter()
    if not (dest / "train").is_dir():
        partial = dest.with_name(f".{dest.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(src / "train", partial / "train")
        paths = sorted(str(p) for p in (partial / "train").rglob("*.JPEG"))
        chunks = [paths[i : i + SHRINK_CHUNK] for i in range(0, len(paths), SHRINK_CHUNK)]
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            done = [
                o for chunk in pool.imap_unordered(functools.partial(rewrite_files, partial), chunks) for o in chunk
            ]
        os.replace(partial, dest)
        outcomes = [outcome for _, outcome in done]
    else:  # made by an earlier check: the same files, compared by name
        marked = {p.relative_to(dest): p.stat().st_size for p in (dest / "train").rglob("*.JPEG")}
        outcomes = [Outcome(ALREADY, (src / rel).stat().st_size, size) for rel, size in marked.items()]
    return {
        "files": len(outcomes),
        "rewritten": sum(o.kind in (REWRITTEN, ALREADY) for o in outcomes),
        "bytes_before": sum(o.before for o in outcomes),
        "bytes_after": sum(o.after for o in outcomes),
        "seconds": round(time.perf_counter() - started, 1),
    }


def mirror(src: Path, dest: Path, paths: list[str]) -> list:
    """shrink.py's mirror of `paths` at MAX_SIDE (a shrinking process's unit of work)."""
    return mirror_files(str(src), str(dest), MAX_SIDE, paths)


def loader_stages(folder: Path, device: str, seconds: float, batch: int = 256, size: int = 224) -> dict:
    """--loader gpu's stages timed alone on the JPEGs under `folder`, through the loader's own functions, batch after
    batch for about `seconds` after one batch of warm-up: a worker's part on one core (read each file, draw its crop
    and flip, pack the batch), the batched decode on `device`, and the finishing (crop, resize, flip: one kernel on a
    GPU), the device synchronised after each. Milliseconds a batch (median) and images/s of each."""
    files = [str(f) for f in sorted(folder.rglob("*.JPEG"))[: 4 * batch]]
    steps, on = train_transform(size, 0.08, True, "gpu"), torch.device(device)
    chunks = [files[i : i + batch] for i in range(0, len(files), batch)]
    spent: dict[str, list[float]] = {"read_draw_pack": [], "decode": [], "finish": []}

    def timed(stage: str, do):
        started = time.perf_counter()
        done = do()
        if device == "cuda":
            torch.cuda.synchronize()
        spent[stage].append(time.perf_counter() - started)
        return done

    def one(chunk: list[str]) -> None:
        packed = timed("read_draw_pack", lambda: gpu_decode.collate([(steps.encode(path), 0) for path in chunk]))
        samples = packed.samples
        images = timed("decode", lambda: gpu_decode.decode_images(samples, steps.read, on))
        timed("finish", lambda: gpu_decode.finish_batch(images, samples, steps, on))

    one(chunks[0])
    for seconds_of_stage in spent.values():  # the warm-up's (the kernel compiled, the files cached) left out
        seconds_of_stage.clear()
    started, images = time.perf_counter(), 0
    while time.perf_counter() - started < seconds or not images:
        for chunk in chunks:
            one(chunk)
            images += len(chunk)
    return {"device": device, "batch": batch, "images": images} | {
        stage: {"ms_per_batch": round(1000 * statistics.median(times), 2), "images_per_sec": images / sum(times)}
        for stage, times in spent.items()
    }
