"""`trainflow bench loader`: images/s per core of each training loader on ImageNet-like JPEGs, and where it goes.

Every CPU loader of the trainer (`--loader`: fast, pil, and dali where NVIDIA DALI is installed; gpu is `bench
gpu`'s) reads the same JPEGs (photographs of ImageNet's sizes, quality 90, about 110 KB on average, made by
infra/data/sample_data.py's write_photo_sized, or --data's train/), and the fast loader reads them once more as
`trainflow data add-restart-markers` rewrites them (RESTARTS: a copy under the workdir, made once; the rewrite's
time per file is measured then). Then every run again on the same JPEGs shrunk at MAX_SIDE as staging `--max-side`
shrinks them (NAME@500: copies made once by infra/data/shrink.py, the shrink's time measured then; RESTARTS@500
shrinks the rewritten copy, as staging shrinks a folder that was rewritten). Each run uses the trainer's own data
set and transforms: the random-resized crop and flip of the training config (224 px by default), batches of
training.batch_size, normalised floats at the end. The uint8 batches of fast and dali are normalised
here, on these cores, as a CPU device does in the step (a GPU does it for nearly nothing). Each loader runs as the
trainer makes it (data.make_loader) in this process alone (1 core: no worker processes, one thread) and with one
worker process (DALI: thread) per core (all cores), counted after the first batch (the workers' start), the rule of
every bench; then one pass in this process split into decode, augment (crop, flip, to floats, normalise) and collate
(the fast loader decodes only the crop: drawing and decoding it is decode; DALI's one pipeline decodes, crops and
flips: all of it counted as decode). REPEATS rounds of everything; every figure the median with its min-max, each
run's speed-up per core over pil on the original JPEGs computed within its round; the headline is RESTARTS@500's.
"""

import hashlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch.utils.data import RandomSampler, default_collate

from benchmarks import REPEATS
from benchmarks.common import RESTARTS, bench_progress, run_ended, shown, spread, write_json
from benchmarks.gpu_plan import installed_loaders
from flows.config import ConfigError, FlowConfig
from infra.core.jsonfiles import read_json
from infra.core.jsonfiles import write_json as keep_json
from infra.data.restart_markers import add_restart_markers
from infra.data.sample_data import write_photo_sized, written_whole
from infra.data.shrink import check_max_side, shrunk_copy
from nodelib.cores import usable_cores
from nodelib.errors import UsageError
from nodelib.layout import Split, index_folder
from trainer import data

BASELINE = "pil"
PARTS = ("decode", "augment", "collate")
REWRITE_RECORD = ".restart-markers.json"  # in the rewritten copy: what the rewrite did and took
SHRINK_RECORD = ".shrink.json"  # in the shrunk copy: what the shrink did and took
DEVICE_LOADERS = ("gpu",)  # they decode on the device, not on these cores
WIDTH = 100  # the tables' least width in characters: a row per run, whatever the terminal (grep finds it)
MAX_SIDE = 500  # the shrunk JPEGs' longer side: FFCV's for ResNet-50 on ImageNet, and `--max-side 500`'s


def bench_loader(
    cfg: FlowConfig, json_out: Path | None, files: int, repeats: int = REPEATS, max_side: int = MAX_SIDE
) -> dict:
    """Measure every loader on the JPEGs and on them shrunk at `max_side`, on 1 core and on all cores, with its time
    split, `repeats` rounds; print and return."""
    try:
        check_max_side(max_side)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    under = cfg.workdir.resolve() / "bench" / "loader"
    folder = Path(cfg.data).resolve() if cfg.data else write_photo_sized(under / f"photo-sized-{files}", files=files)
    split, cores = training_split(folder), usable_cores()
    if len(split.samples) < 2 * cfg.training.batch_size:
        raise ConfigError(
            f"{folder} has {len(split.samples)} training images: timing needs two batches of "
            f"{cfg.training.batch_size} or more (the first starts the workers); pass --files "
            f"{2 * cfg.training.batch_size} or more, or lower training.batch_size"
        )
    loaders, sets = jpeg_sets(folder, split, under, max_side)
    rounds = []
    with one_thread(), bench_progress() as progress:
        bar = progress.add_task("loader benchmark", total=repeats * len(loaders) * (len({1, cores}) + 1))
        ended = run_ended(progress, bar)
        for repeat in range(repeats):
            rounds.append(one_round(cfg.training, cores, loaders, numbered(ended, f"({repeat + 1}/{repeats})")))
    result = summarise(rounds, cores, len(split.samples), cfg.training) | sets
    result["headline"] = headline(result, shrunk_name(RESTARTS, max_side))
    print_loader_bench(result)
    write_json(result, json_out)
    return result


def jpeg_sets(folder: Path, split: Split, under: Path, max_side: int) -> tuple[list[tuple[str, str, Split]], dict]:
    """The runs (each named, its --loader, the images it reads): every loader on the JPEGs and on them shrunk at
    `max_side`, the fast loader on both with restart markers too (shrunk after the rewrite, as staging
    `--max-side` shrinks a folder rewritten by `trainflow data add-restart-markers`); and what each set weighs, what
    the rewrite and the shrink did and took."""
    prepared, rewrite = with_restart_markers(folder, split, under)
    shrunk, shrink = with_shrink(folder, split, under, max_side)
    shrunk_prepared, shrink_prepared = with_shrink(Path(rewrite["folder"]), prepared, under, max_side)
    originals = [(loader, loader, split) for loader in cpu_loaders()] + [(RESTARTS, "fast", prepared)]
    shrunk_runs = [
        (shrunk_name(name, max_side), loader, shrunk_prepared if name == RESTARTS else shrunk)
        for name, loader, _ in originals
    ]
    weights = {
        "originals": sum(Path(path).stat().st_size for path, _ in split.samples),
        RESTARTS: rewrite["bytes_after"],
        shrunk_name("originals", max_side): shrink["bytes_mirror"],
        shrunk_name(RESTARTS, max_side): shrink_prepared["bytes_mirror"],
    }
    return originals + shrunk_runs, {
        "max_side": max_side,
        "bytes": weights,
        "restart_markers": rewrite,
        "shrink": shrink,
    }


def shrunk_name(name: str, max_side: int) -> str:
    """A run (or JPEG set) on the JPEGs shrunk at `max_side`: fast@500."""
    return f"{name}@{max_side}"


def training_split(folder: Path) -> Split:
    """The images of folder/train as the trainer indexes them; a folder it refuses is bad input, in its words."""
    try:
        return index_folder(folder)[0]
    except UsageError as exc:
        raise ConfigError(str(exc)) from None


def with_restart_markers(folder: Path, split: Split, under: Path) -> tuple[Split, dict]:
    """The training split of restart_marked_copy, and what the rewrite did and took: files, bytes before and after,
    ms per file."""
    dest = restart_marked_copy(folder, split, under)
    return training_split(dest), read_json(dest / REWRITE_RECORD)


def restart_marked_copy(folder: Path, split: Split, under: Path) -> Path:
    """A copy of `folder`'s train/ (`split`) rewritten by `trainflow data add-restart-markers`, made once per folder,
    file count and size, under `under`."""
    dest = under / copy_name(folder, split, RESTARTS)
    if not (dest / "train").is_dir():
        with written_whole(dest) as tmp:
            shutil.copytree(folder / "train", tmp / "train")
            done = add_restart_markers(tmp, progress=False)
            keep_json(tmp / REWRITE_RECORD, done | timing(dest, done["seconds"], done["files"]))
    return dest


def with_shrink(folder: Path, split: Split, under: Path, max_side: int) -> tuple[Split, dict]:
    """The training split of shrunk_train_copy, and what the shrink did and took: files shrunk and linked, bytes
    before and after, seconds and ms per file."""
    dest = shrunk_train_copy(folder, split, under, max_side)
    return training_split(dest), read_json(dest / SHRINK_RECORD)


def shrunk_train_copy(folder: Path, split: Split, under: Path, max_side: int) -> Path:
    """A copy of `folder`'s train/ (`split`) as staging `--max-side` makes it (infra/data/shrink.py: the JPEGs
    longer than `max_side` re-encoded at it, the rest hard links), made once per folder, file count, size and side,
    under `under`."""
    dest = under / copy_name(folder, split, f"max{max_side}")
    if not (dest / "train").is_dir():
        with written_whole(dest) as tmp:
            paths = [os.path.relpath(path, folder) for path, _ in split.samples]
            done = shrunk_copy(folder, tmp, max_side, paths, progress=False)
            del done["mirror"]  # the temporary folder's path: "folder" says where the copy lies
            keep_json(tmp / SHRINK_RECORD, done | timing(dest, done["seconds"], done["files"]))
    return dest


def copy_name(folder: Path, split: Split, suffix: str) -> str:
    """The name of a made-once copy of `folder`'s training images: made again when their count or size changes."""
    files = [Path(path) for path, _ in split.samples]
    key = hashlib.sha256(f"{folder.resolve()}|{len(files)}|{sum(f.stat().st_size for f in files)}".encode())
    return f"{folder.name}-{key.hexdigest()[:10]}-{suffix}"


def timing(dest: Path, seconds: float, files: int) -> dict:
    """Where a copy lies, the cores that made it, and its ms per file."""
    return {"folder": str(dest), "cores": usable_cores(), "ms_per_file": seconds * 1e3 / max(files, 1)}


def cpu_loaders() -> tuple[str, ...]:
    """The installed loaders that decode on these cores: this bench's (gpu decodes on the device: `bench gpu`)."""
    return tuple(loader for loader in installed_loaders() if loader not in DEVICE_LOADERS)


@contextmanager
def one_thread() -> Iterator[None]:
    """This process computes with one thread (1 core); the DataLoader's workers do so by themselves."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def numbered(ended: Callable[[str], None], suffix: str) -> Callable[[str], None]:
    """`ended` with the round's number after each line."""
    return lambda line: ended(f"{line} {suffix}")


def one_round(training, cores: int, loaders: list[tuple[str, str, Split]], ended: Callable[[str], None]) -> dict:
    """Each loader's images/s on 1 core and with `cores` workers, and its seconds per image in each part; `loaders`
    names each run, its --loader and the images it reads; `ended` is told each figure as it is measured."""
    rates, parts = {}, {}
    for name, loader, split in loaders:
        dataset = loader_dataset(split, training, loader)
        for used in sorted({1, cores}):  # 1 core: this process alone; more: as many worker processes
            rate = rates[f"{name}/{used}"] = images_per_sec(dataset, training.batch_size, 0 if used == 1 else used)
            ended(f"{name}, {used} core{'s' * (used > 1)}: {rate:.0f} images/s, {rate / used:.0f} per core")
        parts[name] = time_parts(dataset, training.batch_size)
        ended(
            f"{name}, ms per image on one core: " + ", ".join(f"{part} {parts[name][part] * 1e3:.2f}" for part in PARTS)
        )
    return {"rates": rates, "parts": parts}


def loader_dataset(split: Split, training, loader: str) -> data.ImageFiles:
    """The training data set as the trainer builds it for `loader`."""
    transform = data.train_transform(training.image_size, training.min_crop_scale, training.hflip, loader)
    return data.image_files(split, transform, loader)


def images_per_sec(dataset: data.ImageFiles, batch_size: int, workers: int) -> float:
    """Normalised batches per second, in images, after the first batch (which also starts the workers)."""
    batches = iter(data.make_loader(dataset, batch_size, RandomSampler(dataset), workers, False, True))
    data.normalise(next(batches)[0])
    started, seen = time.perf_counter(), 0
    for images, _ in batches:
        seen += len(data.normalise(images))
    return seen / (time.perf_counter() - started)


def time_parts(dataset: data.ImageFiles, batch_size: int) -> dict:
    """Seconds per image of decoding, augmenting (to normalised floats) and collating, over one pass in this
    process, a batch at a time."""
    spent = dict.fromkeys(PARTS, 0.0)
    one_batch = dali_batch(dataset, batch_size) if dataset.decode is None else torch_batch
    for first in range(0, len(dataset) - batch_size + 1, batch_size):
        images = one_batch(dataset, range(first, first + batch_size), spent)
        timed(spent, "augment", data.normalise, images)
    counted = len(dataset) // batch_size * batch_size
    return {part: seconds / counted for part, seconds in spent.items()}


def torch_batch(dataset: data.ImageFiles, indices: range, spent: dict) -> torch.Tensor:
    """One batch of the PIL or fast loader: each image decoded (the fast loader's: only its crop), then transformed
    (the fast loader's: resized and flipped), then the batch collated (as the loader's DataLoader collates it)."""
    decoded = [timed(spent, "decode", dataset.decode, dataset.samples[i][0]) for i in indices]
    samples = [(timed(spent, "augment", dataset.transform, image), 0) for image in decoded]
    return timed(spent, "collate", dataset.collate or default_collate, samples)[0]


def dali_batch(dataset: data.ImageFiles, batch_size: int) -> Callable:
    """One batch of DALI's pipeline on one thread: decode, crop and flip at once, all counted as decode."""
    pipeline = data.make_loader(dataset, batch_size, None, 1, False, True)
    return lambda _, indices, spent: timed(spent, "decode", pipeline.decode, list(indices))[0]


def timed(spent: dict, part: str, fn, *args):
    """fn(*args), its seconds added to spent[part]."""
    started = time.perf_counter()
    result = fn(*args)
    spent[part] += time.perf_counter() - started
    return result


def summarise(rounds: list[dict], cores: int, images: int, training) -> dict:
    """Per loader and core count: images/s and images/s per core; the parts in ms per image; the fast loader's
    speed-up per core over pil, each within its round."""
    runs = {
        key: {
            "images_per_sec": spread(rates := [r["rates"][key] for r in rounds]),
            "per_core": spread([rate / int(key.split("/")[1]) for rate in rates]),
        }
        for key in rounds[0]["rates"]
    }
    loaders = list(rounds[0]["parts"])
    speedup = {
        loader: {
            str(n): spread([r["rates"][f"{loader}/{n}"] / r["rates"][f"{BASELINE}/{n}"] for r in rounds])
            for n in sorted({1, cores})
        }
        for loader in loaders
        if loader != BASELINE
    }
    parts = {
        loader: {part: spread([r["parts"][loader][part] * 1e3 for r in rounds]) for part in PARTS} for loader in loaders
    }
    return {
        "images": images,
        "cores": cores,
        "repeats": len(rounds),
        "image_size": training.image_size,
        "min_crop_scale": training.min_crop_scale,
        "hflip": training.hflip,
        "batch_size": training.batch_size,
        "runs": runs,
        "speedup_per_core": speedup,
        "ms_per_image": parts,
    }


def headline(result: dict, run: str) -> dict:
    """The figure the shrink is for: `run` (the fast loader on shrunk JPEGs with restart markers) against pil on the
    original JPEGs, per core, on 1 core and on all, each ratio within its round (speedup_per_core's)."""
    return {"run": run, "against": BASELINE, "per_core": result["speedup_per_core"][run]}


def print_loader_bench(r: dict) -> None:
    """The loader figures as two tables: images/s and per core; the time split. Medians, min-max in brackets."""
    table = Table(
        title=f"loaders on {r['images']} JPEGs, crop to {r['image_size']} px, batch {r['batch_size']}, "
        f"median (min-max) of {r['repeats']} rounds"
    )
    for column in ("loader", "cores", "images/s", "images/s per core", "per core vs pil"):
        table.add_column(column, justify="right")
    for key, figures in r["runs"].items():
        loader, cores = key.split("/")
        ratio = shown(r["speedup_per_core"][loader][cores], ".2f") + "x" if loader != BASELINE else ""
        table.add_row(loader, cores, shown(figures["images_per_sec"], ".0f"), shown(figures["per_core"], ".0f"), ratio)
    console = Console(width=max(Console().width, WIDTH))
    console.print(table)
    parts = Table(title="one core's time per image, ms")
    for column in ("loader", *PARTS):
        parts.add_column(column, justify="right")
    for loader, figures in r["ms_per_image"].items():
        parts.add_row(loader, *(shown(figures[part], ".2f") for part in PARTS))
    console.print(parts)
    if rewrite := r.get("restart_markers"):
        print(
            f"{RESTARTS}: the same JPEGs as rewritten by `trainflow data add-restart-markers` (once, in "
            f"{rewrite['seconds']:.1f} s on {rewrite['cores']} cores: {rewrite['ms_per_file']:.1f} ms per file; "
            f"{rewrite['bytes_before'] / 1e6:.1f} MB -> {rewrite['bytes_after'] / 1e6:.1f} MB)"
        )
    if shrink := r.get("shrink"):
        print_shrink(r, shrink)


def print_shrink(r: dict, shrink: dict) -> None:
    """What the shrunk sets are, what each set weighs, and the headline ratio."""
    side, weights = r["max_side"], r["bytes"]
    print(
        f"@{side}: the same JPEGs shrunk at {side} px as staging --max-side {side} does ({shrink['shrunk']} of "
        f"{shrink['files']} re-encoded, the rest linked; once, in {shrink['seconds']:.1f} s on {shrink['cores']} "
        f"cores: {shrink['ms_per_file']:.1f} ms per file); {RESTARTS}@{side}: the JPEGs with restart markers, shrunk"
    )
    print("MB read: " + ", ".join(f"{name} {size / 1e6:.1f}" for name, size in weights.items()))
    top = r["headline"]
    print(
        f"headline, {top['run']} against {top['against']} on the originals, per core: "
        + ", ".join(f"{n} core{'s' * (n != '1')} {shown(f, '.2f')}x" for n, f in top["per_core"].items())
    )
