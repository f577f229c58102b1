"""`trainflow bench loader`: images/s per core of each training loader on ImageNet-like JPEGs, and where it goes.

Every loader of the trainer (`--loader`: fast, pil, and dali where NVIDIA DALI is installed) reads the same JPEGs
(500x375, quality 90, about 110 KB, made by infra/data/sample_data.py's write_photo_like, or --data's train/), and the
fast loader reads them once more as `trainflow data add-restart-markers` rewrites them (RESTARTS: a copy under the
workdir, made once; the rewrite's time per file is measured then), each with the trainer's own data set and
transforms: the random-resized crop and flip of the training config (224 px by default), batches of
training.batch_size, normalised floats at the end. The uint8 batches of fast and dali are normalised
here, on these cores, as a CPU device does in the step (a GPU does it for nearly nothing). Each loader runs as the
trainer makes it (data.make_loader) in this process alone (1 core: no worker processes, one thread) and with one
worker process (DALI: thread) per core (all cores), counted after the first batch (the workers' start), the rule of
every bench; then one pass in this process split into decode, augment (crop, flip, to floats, normalise) and collate
(the fast loader decodes only the crop: drawing and decoding it is decode; DALI's one pipeline decodes, crops and
flips: all of it counted as decode). REPEATS rounds of everything; every figure the median with its min-max, each
loader's speed-up over pil computed within its round.
"""

import hashlib
import importlib.util
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
from flows.config import ConfigError, FlowConfig
from infra.core.jsonfiles import read_json
from infra.core.jsonfiles import write_json as keep_json
from infra.data.restart_markers import add_restart_markers
from infra.data.sample_data import write_photo_like, written_whole
from trainer import data
from trainer.errors import UsageError
from trainer.layout import Split, index_folder

BASELINE = "pil"
PARTS = ("decode", "augment", "collate")
REWRITE_RECORD = ".restart-markers.json"  # in the rewritten copy: what the rewrite did and took


def bench_loader(cfg: FlowConfig, json_out: Path | None, files: int, repeats: int = REPEATS) -> dict:
    """Measure every loader on 1 core and on all cores, with its time split, `repeats` rounds; print and return."""
    folder = (
        Path(cfg.data).resolve()
        if cfg.data
        else write_photo_like(cfg.workdir.resolve() / "bench" / "loader" / f"photo-like-{files}", files=files)
    )
    split, cores = training_split(folder), len(os.sched_getaffinity(0))
    if len(split.samples) < 2 * cfg.training.batch_size:
        raise ConfigError(
            f"{folder} has {len(split.samples)} training images: timing needs two batches of "
            f"{cfg.training.batch_size} or more (the first starts the workers); pass --files "
            f"{2 * cfg.training.batch_size} or more, or lower training.batch_size"
        )
    prepared, rewrite = with_restart_markers(folder, split, cfg.workdir.resolve() / "bench" / "loader")
    loaders = [(loader, loader, split) for loader in installed_loaders()] + [(RESTARTS, "fast", prepared)]
    rounds = []
    with one_thread(), bench_progress() as progress:
        bar = progress.add_task("loader benchmark", total=repeats * len(loaders) * (len({1, cores}) + 1))
        ended = run_ended(progress, bar)
        for repeat in range(repeats):
            rounds.append(one_round(cfg.training, cores, loaders, numbered(ended, f"({repeat + 1}/{repeats})")))
    result = summarise(rounds, cores, len(split.samples), cfg.training) | {"restart_markers": rewrite}
    print_loader_bench(result)
    write_json(result, json_out)
    return result


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
    files = [Path(path) for path, _ in split.samples]  # the copy is made again when they change
    key = hashlib.sha256(f"{folder.resolve()}|{len(files)}|{sum(f.stat().st_size for f in files)}".encode())
    dest = under / f"{folder.name}-{key.hexdigest()[:10]}-{RESTARTS}"
    if not (dest / "train").is_dir():
        with written_whole(dest) as tmp:
            shutil.copytree(folder / "train", tmp / "train")
            done = add_restart_markers(tmp, progress=False)
            keep_json(
                tmp / REWRITE_RECORD,
                done
                | {
                    "folder": str(dest),
                    "cores": len(os.sched_getaffinity(0)),
                    "ms_per_file": done["seconds"] * 1e3 / max(done["files"], 1),
                },
            )
    return dest


def installed_loaders() -> tuple[str, ...]:
    """The trainer's loaders that can run here: dali only where NVIDIA DALI is installed."""
    return tuple(loader for loader in data.LOADERS if loader != "dali" or importlib.util.find_spec("nvidia.dali"))


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
    (the fast loader's: resized and flipped), then the batch collated."""
    decoded = [timed(spent, "decode", dataset.decode, dataset.samples[i][0]) for i in indices]
    samples = [(timed(spent, "augment", dataset.transform, image), 0) for image in decoded]
    return timed(spent, "collate", default_collate, samples)[0]


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
    Console().print(table)
    parts = Table(title="one core's time per image, ms")
    for column in ("loader", *PARTS):
        parts.add_column(column, justify="right")
    for loader, figures in r["ms_per_image"].items():
        parts.add_row(loader, *(shown(figures[part], ".2f") for part in PARTS))
    Console().print(parts)
    if rewrite := r.get("restart_markers"):
        print(
            f"{RESTARTS}: the same JPEGs as rewritten by `trainflow data add-restart-markers` (once, in "
            f"{rewrite['seconds']:.1f} s on {rewrite['cores']} cores: {rewrite['ms_per_file']:.1f} ms per file; "
            f"{rewrite['bytes_before'] / 1e6:.1f} MB -> {rewrite['bytes_after'] / 1e6:.1f} MB)"
        )
