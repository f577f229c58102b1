"""Data sets written to disk: scikit-learn's bundled 8x8 digits as ImageNet-layout PNGs, photo-like JPEGs of
ImageNet's sizes for the loader and staging benchmarks, and ImageNet-shaped folders of small JPEGs (any shape up to
the full ImageNet-1k one) for testing staging and listing at scale."""

import functools
import io
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from infra.core.errors import BadInput
from infra.core.jsonfiles import read_json, write_json
from infra.data.photos import make_photo_folders, photo_plan, write_photo


@contextmanager
def written_whole(dest: Path) -> Iterator[Path]:
    """A temporary sibling of `dest` to fill: renamed to `dest` when the block ends well, removed otherwise, so
    that the folder appears whole or not at all."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the data from the other users of a shared machine
        yield tmp
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_digits(dest: Path, size: int = 32, val_fraction: float = 0.2, seed: int = 0, fmt: str = "png") -> Path:
    """Write dest/train/<digit>/*.png and dest/val/<digit>/*.png once (fmt="jpg": grayscale JPEGs, quality 95);
    an existing copy is kept."""
    if (dest / "train").is_dir() and (dest / "val").is_dir():
        return dest
    from sklearn.datasets import load_digits  # ships its data: nothing is downloaded

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    n_val = int(len(order) * val_fraction)
    with written_whole(dest) as tmp:
        for position, index in enumerate(order):
            split = "val" if position < n_val else "train"
            pixels = (digits.images[index] * (255 / 16)).astype(np.uint8)
            image = Image.fromarray(pixels, mode="L").resize((size, size), Image.Resampling.BILINEAR)
            folder = tmp / split / str(digits.target[index])
            folder.mkdir(parents=True, exist_ok=True)
            image.save(folder / f"{index:04d}.{fmt}", quality=95)  # (PNG has no quality: PIL ignores it)
    return dest


def write_imagenet_like(dest: Path, files: int = 5000, classes: int = 100, kb: int = 110, seed: int = 0) -> Path:
    """An ImageNet-shaped folder of random JPEGs of about `kb` KB (90% train, 10% val), written once."""
    if (dest / "train").is_dir():
        return dest
    rng = np.random.default_rng(seed)
    side = _side_for(kb, rng)
    with written_whole(dest) as tmp:
        for i in range(files):
            split = "val" if (i // classes) % 10 == 9 else "train"
            folder = tmp / split / f"n{i % classes:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"img_{i:07d}.JPEG", quality=85)
    return dest


def _side_for(kb: int, rng: np.random.Generator) -> int:
    """The side of a square noise JPEG (quality 85) that weighs about `kb` KB."""
    probe = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (200, 200, 3), dtype=np.uint8)).save(probe, "JPEG", quality=85)
    return max(8, round(200 * (kb * 1024 / len(probe.getvalue())) ** 0.5))


PARALLEL_PHOTOS = 64  # photo-sized sets of this many files or more are written by WRITERS processes


def write_photo_sized(
    dest: Path, files: int = 512, classes: int = 8, seed: int = 0, val_files: int = 0, workers: int | None = None
) -> Path:
    """An ImageNet-layout folder of photo-like JPEGs (quality 90) sized as ImageNet's training photographs are
    (photos.py: LONGER_SIDES, ASPECTS), written once and whole: `files` in train/, `val_files` in val/; the same
    seed, the same bytes. In WRITERS processes from PARALLEL_PHOTOS files (a 3,000 px photograph takes a second)."""
    if files < 1 or classes < 1 or val_files < 0:
        raise BadInput(
            f"a photo-sized set needs 1 file or more, 1 class or more and 0 validation files or more, not "
            f"files={files}, classes={classes}, val_files={val_files}"
        )
    if (dest / "train").is_dir():
        return dest
    photos = photo_plan(files, classes, seed, val_files)
    if workers is None:
        workers = WRITERS if len(photos) >= PARALLEL_PHOTOS else 1
    with written_whole(dest) as tmp:
        make_photo_folders(tmp, photos)
        write = functools.partial(write_photo, str(tmp), seed)
        with writer_pool(workers) as pool:
            for _ in pool.imap_unordered(write, photos, chunksize=4) if pool else map(write, photos):
                pass
    return dest


# ImageNet-shaped sets: DEST/train/<wnid>/<wnid>_<k>.JPEG and DEST/val/<wnid>/ILSVRC2012_val_<8 digits>.JPEG, the
# names of ImageNet-1k (ILSVRC2012) at any shape. Each file is one of a few small JPEGs encoded once, made unique
# (its bytes and hash) by a comment segment holding its own path: no file is encoded, so writing is limited by the
# file system alone (measured: see README).
SHAPE_RECORD = ".imagenet-shaped.json"  # written last, inside the folder: its shape, files and bytes
MAX_CLASSES = 100_000  # the wnids "n" + 8 digits stay distinct and sorted below this
CHUNK_FILES = 1000  # files per unit of work: the progress bar moves and the writers share work at this grain
PARALLEL_FROM_FILES = 5000  # smaller sets are written in this process (starting writers would cost more)
WRITERS = 2  # processes: 1.1-2x the files/s of 1 on 2 cores (ext4); threads gained nothing (GIL between syscalls)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


class ImagenetShape(NamedTuple):
    """How many classes, training images per class and validation images per class."""

    classes: int = 1000
    per_class: int = 1281
    val_per_class: int = 50

    @property
    def files(self) -> int:
        """Images in all."""
        return self.classes * (self.per_class + self.val_per_class)

    @property
    def label(self) -> str:
        """The shape in a name: 1000x1281+50."""
        return f"{self.classes}x{self.per_class}+{self.val_per_class}"

    def check(self) -> None:
        """BadInput naming the option that cannot be used, if any."""
        if not 2 <= self.classes <= MAX_CLASSES:
            raise BadInput(
                f"--classes must be 2 to {MAX_CLASSES:,} (a classifier needs 2 classes or more), not {self.classes}"
            )
        if self.per_class < 1:
            raise BadInput(f"--per-class must be 1 or more (each class needs training images), not {self.per_class}")
        if self.val_per_class < 0:
            raise BadInput(f"--val-per-class must be 0 or more (0: no val/ folder), not {self.val_per_class}")
        if self.classes * self.val_per_class > 99_999_999:
            raise BadInput(
                f"--val-per-class must be at most {99_999_999 // self.classes:,} with {self.classes:,} "
                f"classes (validation files are numbered with 8 digits), not {self.val_per_class:,}"
            )


class _Chunk(NamedTuple):
    """The files `first` to `last` - 1 (counting from 0) of one class in one split."""

    split: str
    wnid: str
    first_number: int  # of the class's first file: train files count from 1 in each class, val files across all
    first: int
    last: int


def imagenet_wnids(classes: int) -> list[str]:
    """Class folder names in ImageNet's form ("n" + 8 digits), distinct and sorted; the first is ImageNet's own."""
    return [f"n{1440764 + 97 * index:08d}" for index in range(classes)]


def write_imagenet_shaped(
    dest: Path,
    classes: int = 1000,
    per_class: int = 1281,
    val_per_class: int = 50,
    progress: bool = True,
    workers: int | None = None,
) -> dict:
    """Write an ImageNet-shaped set of small, distinct, valid JPEGs at `dest` once; a complete one of the same shape
    is kept (`kept`), one of another shape (or another folder) is refused. Returns path, files, bytes, seconds."""
    shape = ImagenetShape(classes, per_class, val_per_class)
    shape.check()
    kept = _existing_set(dest, shape)
    if kept:
        return {"path": str(dest), "files": kept["files"], "bytes": kept["bytes"], "seconds": 0.0, "kept": True}
    _check_room(dest.parent, shape)
    start = time.perf_counter()
    with written_whole(dest) as tmp:
        files, size = _write_files(tmp, _make_folders(tmp, shape), workers, progress)
        write_json(tmp / SHAPE_RECORD, {**shape._asdict(), "files": files, "bytes": size})
    return {"path": str(dest), "files": files, "bytes": size, "seconds": time.perf_counter() - start, "kept": False}


def _existing_set(dest: Path, shape: ImagenetShape) -> dict | None:
    """The record of the set already at `dest` if it has this shape; None if there is nothing (or an empty folder)."""
    if not dest.exists() or (dest.is_dir() and not any(dest.iterdir())):
        return None
    record = read_json(dest / SHAPE_RECORD) if dest.is_dir() else {}
    if not record:
        raise BadInput(
            f"{dest} exists and is not an ImageNet-shaped set written by trainflow; choose another --data or delete it"
        )
    found = ImagenetShape._make(record.get(field) for field in ImagenetShape._fields)
    if found != shape:
        raise BadInput(
            f"{dest} holds an ImageNet-shaped set of {found.label}, not {shape.label} "
            "(classes x per class + val per class); choose another --data or delete it"
        )
    return record


def _check_room(folder: Path, shape: ImagenetShape) -> None:
    """Refuse, before writing anything, a set that the file system holding `folder` has no room or inodes for."""
    while not folder.exists():
        folder = folder.parent
    disk = os.statvfs(folder)
    block = disk.f_frsize or 4096
    per_file = sum(-(-(len(base) + 100) // block) * block for base in _base_jpegs()) / len(_base_jpegs())
    needed, free = shape.files * per_file, disk.f_bavail * disk.f_frsize
    if needed > free:
        raise BadInput(
            f"{shape.files:,} files need about {needed / 1e6:,.1f} MB and {folder} has {free / 1e6:,.1f} "
            "MB free; free space there or choose another --data"
        )
    if disk.f_files and shape.files + 2 * shape.classes > disk.f_favail:  # f_files 0: no fixed inode count
        raise BadInput(
            f"{shape.files:,} files need as many inodes and {folder} has {disk.f_favail:,} free; "
            "choose another --data on another file system"
        )


def _make_folders(root: Path, shape: ImagenetShape) -> list[_Chunk]:
    """Create every class folder under `root` and return the work: chunks of at most CHUNK_FILES files."""
    chunks = []
    for index, wnid in enumerate(imagenet_wnids(shape.classes)):
        for split, count, first_number in (
            ("train", shape.per_class, 1),
            ("val", shape.val_per_class, 1 + index * shape.val_per_class),
        ):
            if count:
                (root / split / wnid).mkdir(parents=True)
                chunks += [
                    _Chunk(split, wnid, first_number, first, min(first + CHUNK_FILES, count))
                    for first in range(0, count, CHUNK_FILES)
                ]
    return chunks


def _write_files(root: Path, chunks: list[_Chunk], workers: int | None, progress: bool) -> tuple[int, int]:
    """Write the chunks' files under `root`, in WRITERS processes for a large set; return files and bytes written."""
    total = sum(chunk.last - chunk.first for chunk in chunks)
    if workers is None:
        workers = WRITERS if total >= PARALLEL_FROM_FILES else 1
    write = functools.partial(_write_chunk, str(root))
    _base_jpegs()  # encoded once here: forked writers inherit them
    files = size = 0
    with writer_pool(workers) as pool, files_bar(progress) as bar:
        task = bar.add_task("writing", total=total)
        for written, nbytes in pool.imap_unordered(write, chunks) if pool else map(write, chunks):
            files, size = files + written, size + nbytes
            bar.update(task, advance=written)
    return files, size


@contextmanager
def writer_pool(workers: int):
    """A pool of `workers` forked writer processes (None for 1, or where fork is not available); they stop with it."""
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield None
        return
    with multiprocessing.get_context("fork").Pool(workers, _start_writer, (os.getpid(),)) as pool:
        yield pool


def _start_writer(parent: int) -> None:
    """In a writer: leave interrupts to the parent (it stops the pool), and exit if the parent is killed outright
    (a pool's workers would otherwise wait for work forever)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def exit_with_parent() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=exit_with_parent, daemon=True).start()


def files_bar(enabled: bool):
    """A progress bar of files written, on stderr."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("files"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def _write_chunk(root: str, chunk: _Chunk) -> tuple[int, int]:
    """Write one chunk's files (their folder exists); return files and bytes written."""
    bases = _base_jpegs()
    folder = os.open(os.path.join(root, chunk.split, chunk.wnid), os.O_RDONLY | os.O_DIRECTORY)
    size = 0
    try:
        for k in range(chunk.first, chunk.last):
            number = chunk.first_number + k
            name = f"{chunk.wnid}_{number}.JPEG" if chunk.split == "train" else f"ILSVRC2012_val_{number:08d}.JPEG"
            data = _with_comment(bases[number % len(bases)], f"{chunk.split}/{chunk.wnid}/{name}".encode())
            fd = os.open(name, _CREATE, 0o644, dir_fd=folder)  # relative to the open folder: no path lookups
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(28, "No space left on device", name)  # a short write: the disk filled up
            finally:
                os.close(fd)
            size += len(data)
    finally:
        os.close(folder)
    return chunk.last - chunk.first, size


def _with_comment(jpeg: bytes, text: bytes) -> bytes:
    """`jpeg` with a comment segment (COM: FF FE, its length, `text`) right after its start-of-image marker."""
    return b"".join((b"\xff\xd8\xff\xfe", (len(text) + 2).to_bytes(2, "big"), text, jpeg[2:]))


@functools.cache
def _base_jpegs() -> tuple[bytes, ...]:
    """Eight small RGB JPEGs, 8 to 64 pixels a side, shaded and noisy to weigh about 300 B to 3 KB each."""
    rng = np.random.default_rng(0)
    bases = []
    for side, noise in ((8, 0), (16, 8), (24, 24), (32, 16), (40, 48), (48, 32), (56, 56), (64, 80)):
        y, x = np.mgrid[0:side, 0:side] / side
        shade = rng.integers(0, 256, 3) * (0.5 + 0.5 * x[..., None]) * (0.6 + 0.4 * y[..., None])
        pixels = np.clip(shade + rng.normal(0, noise + 1e-9, (side, side, 3)), 0, 255).astype(np.uint8)
        encoded = io.BytesIO()
        Image.fromarray(pixels).save(encoded, "JPEG", quality=85, optimize=True)
        bases.append(encoded.getvalue())
    return tuple(bases)
