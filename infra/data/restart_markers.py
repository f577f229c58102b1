"""`trainflow data add-restart-markers`: the training JPEGs of a folder rewritten, losslessly, with a restart marker
after every MCU, so that the fast loader decodes only the MCUs of each random crop (trainer/jpeg_crop.c) instead of
entropy-decoding every row down to the crop's last. Its rewriting imports nothing beyond the trainer's own modules
and Pillow, so the device check (benchmarks/device_check.py) runs it on a GPU machine too.

Each file keeps its DCT coefficients (the same pixels: each rewrite is decoded and compared with the original before
it replaces it), gets Huffman tables optimised for it, and keeps its other markers (EXIF, ICC, comments). A file is
replaced whole (a temporary sibling, then a rename), so an interrupted run leaves every file either as it was or
rewritten, and a second run rewrites only the rest. Left as they were, and listed: CMYK JPEGs, JPEGs libjpeg refuses
or PIL cannot decode (the check needs both), files reached through a symbolic link (the target may be shared),
hard-linked files (a rewrite would split the names), read-only ones, ones owned by another user that this process
cannot give back to them, and ones that change while they are rewritten. The fast loader reads them as before.
"""

import functools
import io
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from PIL import Image

from nodelib.cores import usable_cores
from nodelib.errors import UsageError
from nodelib.layout import class_names, split_folders, split_images
from trainer import jpeg_crop

TEMPORARY = ".restarts-tmp"  # the suffix of a file being written; one left by a killed run is removed by the next
CHUNK = 64  # files per unit of work handed to a writer process
REWRITTEN, ALREADY, NOT_JPEG, LEFT = "rewritten", "already had them", "not JPEGs", "left as they were"


class Outcome(NamedTuple):
    """What became of one file: REWRITTEN, ALREADY, NOT_JPEG or LEFT (with why), and its size before and after."""

    kind: str
    before: int
    after: int
    why: str = ""


class Left(UsageError):
    """A JPEG this command leaves as it was, and why (caught per file: it never ends the command)."""


def training_images(data_dir: Path) -> Iterator[str]:
    """The images of DATA/train by the layout's rules (the ones the random crop is drawn from); val/ is decoded
    whole, where restart markers save nothing."""
    train_dir, _ = split_folders(data_dir)  # a folder of another layout: UsageError, bad input where it is met
    yield from (path for path, _ in split_images(train_dir, class_names(train_dir, None)))


def remove_leftovers(data_dir: Path) -> int:
    """Remove the temporary files a killed run left under DATA/train, at any depth; how many."""
    leftovers = list((data_dir / "train").rglob(f".*{TEMPORARY}"))
    for path in leftovers:
        path.unlink(missing_ok=True)
    return len(leftovers)


def add_restart_markers(data_dir: Path, workers: int | None = None, progress: bool = True) -> dict:
    """Rewrite every training JPEG of `data_dir` that lacks restart markers; the counts, bytes and seconds, and every
    JPEG left as it was with why."""
    from infra.data.sample_data import files_bar, writer_pool  # rich: the orchestrator's only, not the GPU machine's

    if jpeg_crop.library() is None:
        raise UsageError(
            f"cannot rewrite JPEGs here: {jpeg_crop.unavailable()} (Debian and Ubuntu: apt-get install gcc libjpeg-dev)"
        )
    started, data_dir = time.perf_counter(), data_dir.resolve()
    removed = remove_leftovers(data_dir)
    paths = list(training_images(data_dir))
    counts, before, after, left = dict.fromkeys((REWRITTEN, ALREADY, NOT_JPEG, LEFT), 0), 0, 0, []
    workers = workers or usable_cores()
    rewrite = functools.partial(rewrite_files, data_dir)
    try:
        with writer_pool(workers if len(paths) > CHUNK else 1) as pool, files_bar(progress) as bar:
            task = bar.add_task("adding restart markers", total=len(paths))
            chunks = [paths[i : i + CHUNK] for i in range(0, len(paths), CHUNK)]
            for done in pool.imap(rewrite, chunks) if pool else map(rewrite, chunks):
                for path, outcome in done:
                    counts[outcome.kind] += 1
                    before, after = before + outcome.before, after + outcome.after
                    if outcome.kind == LEFT:
                        left.append((path, outcome.why))
                bar.update(task, advance=len(done))
    finally:  # an interrupt stops the writers wherever they are: a temporary file may be left, never a half file
        remove_leftovers(data_dir)
    return {
        "folder": str(data_dir),
        "files": len(paths),
        **counts,
        "bytes_before": before,
        "bytes_after": after,
        "seconds": time.perf_counter() - started,
        "left": left,
        "leftovers_removed": removed,
    }


def rewrite_files(data_dir: Path, paths: list[str]) -> list[tuple[str, Outcome]]:
    """rewrite_file for each path (a writer's unit of work)."""
    return [(path, rewrite_file(data_dir, Path(path))) for path in paths]


def rewrite_file(data_dir: Path, path: Path) -> Outcome:
    """The JPEG at `path` with a restart marker after every MCU, checked to decode to the same pixels, put in its
    place whole (its permissions and owner kept); a file that already has them, or must not be rewritten, is left
    as it was."""
    try:
        found = path.lstat()
        data = path.read_bytes()
    except OSError as exc:
        return Outcome(LEFT, 0, 0, f"cannot be read ({exc.strerror or exc})")
    shape = jpeg_crop.info(data)
    if shape is None:
        return Outcome(NOT_JPEG, len(data), len(data))
    if jpeg_crop.cuttable(data):
        return Outcome(ALREADY, len(data), len(data))
    try:
        check_rewritable(data_dir, path, found, shape[2])
        rewritten = lossless_rewrite(data)
        replace_whole(path, rewritten, found)
    except Left as exc:
        return Outcome(LEFT, len(data), len(data), str(exc))
    return Outcome(REWRITTEN, len(data), len(rewritten))


def check_rewritable(data_dir: Path, path: Path, found: os.stat_result, components: int) -> None:
    """Left when the file must stay as it is: CMYK, a link, hard-linked or read-only."""
    if components not in jpeg_crop.TO_RGB:
        raise Left(f"CMYK or YCCK ({components} components): the fast loader decodes it through PIL")
    if path.resolve() != data_dir / path.relative_to(data_dir):
        raise Left("a symbolic link, or inside a linked folder: its target may be shared, so it is left alone")
    if found.st_nlink > 1:
        raise Left(f"hard-linked ({found.st_nlink} names): a rewrite would split them")
    if not found.st_mode & stat.S_IWUSR:
        raise Left("read-only")


def lossless_rewrite(data: bytes) -> bytes:
    """`data` with restart markers, checked to decode to the same pixels as PIL decodes the original."""
    try:
        rewritten = jpeg_crop.add_restarts(data)
    except jpeg_crop.JpegError as exc:
        raise Left(f"libjpeg refused it: {exc}") from None
    original = pixels(data)
    if original is None:
        raise Left("PIL cannot decode it, so the rewrite cannot be checked")
    if pixels(rewritten) != original:
        raise Left("the rewrite would not decode to the same pixels")
    return rewritten


def pixels(data: bytes) -> tuple[str, tuple[int, int], bytes] | None:
    """A JPEG's decoded mode, size and pixels, as PIL (the pil loader) decodes it; None when PIL cannot."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.mode, img.size, img.tobytes()
    except Exception:
        return None


def replace_whole(path: Path, data: bytes, found: os.stat_result) -> None:
    """`data` in place of the file at `path` (as `found` saw it), written to a temporary sibling first (permissions
    and owner copied), then renamed over it: never half written. Left when it changed meanwhile or cannot be
    replaced."""
    try:
        fd, temporary = tempfile.mkstemp(prefix=".", suffix=TEMPORARY, dir=path.parent)
    except OSError as exc:
        raise Left(f"its folder cannot be written ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(temporary, found.st_mode & 0o7777)
        if (found.st_uid, found.st_gid) != (os.geteuid(), os.getegid()):
            try:
                os.chown(temporary, found.st_uid, found.st_gid)
            except PermissionError:
                raise Left(f"owned by user {found.st_uid}: a rewrite by this user would take it over") from None
        now = path.lstat()
        if (now.st_ino, now.st_size, now.st_mtime_ns) != (found.st_ino, found.st_size, found.st_mtime_ns):
            raise Left("changed while it was rewritten")
        os.replace(temporary, path)
    except OSError as exc:
        raise Left(f"cannot be replaced ({exc.strerror or exc})") from None
    finally:
        Path(temporary).unlink(missing_ok=True)
