"""`trainflow data add-restart-markers`: the training JPEGs of a folder rewritten, losslessly, with a restart marker
after every MCU, so that the fast loader decodes only the MCUs of each random crop (trainer/jpeg_crop.c) instead of
entropy-decoding every row down to the crop's last.

Each file keeps its DCT coefficients (the same pixels: each rewrite is decoded and compared with the original before
it replaces it), gets Huffman tables optimised for it, and keeps its other markers (EXIF, ICC, comments). A file is
replaced whole (a temporary sibling, then a rename), so an interrupted run leaves every file either as it was or
rewritten, and a second run rewrites only the rest. Files left as they were: not JPEGs, CMYK JPEGs, and JPEGs libjpeg
refuses or whose rewrite would not decode to the same pixels; the fast loader reads them as before.
"""

import io
import os
import time
from pathlib import Path
from typing import Iterator, NamedTuple

from PIL import Image
from trainer import jpeg_crop
from trainer.errors import UsageError
from trainer.layout import class_names, split_folders, split_images

from infra.errors import BadInput
from infra.sample_data import files_bar, writer_pool

TEMPORARY = ".restarts-tmp"  # the suffix of a file being written; one left by a killed run is removed by the next
CHUNK = 64  # files per unit of work handed to a writer process
REWRITTEN, ALREADY, LEFT = "rewritten", "already had them", "left as they were"


class Outcome(NamedTuple):
    """What became of one file: REWRITTEN, ALREADY or LEFT (with why), and its size before and after."""

    kind: str
    before: int
    after: int
    why: str = ""


def training_jpegs(data_dir: Path) -> Iterator[str]:
    """The images of DATA/train by the layout's rules (the ones the random crop is drawn from); val/ is decoded
    whole, where restart markers save nothing."""
    try:
        train_dir, _ = split_folders(data_dir)
        yield from (path for path, _ in split_images(train_dir, class_names(train_dir, None)))
    except UsageError as exc:
        raise BadInput(str(exc)) from None


def remove_leftovers(data_dir: Path) -> int:
    """Remove the temporary files a killed run left under DATA/train; how many."""
    leftovers = list((data_dir / "train").glob(f"*/.*{TEMPORARY}"))
    for path in leftovers:
        path.unlink(missing_ok=True)
    return len(leftovers)


def add_restart_markers(data_dir: Path, workers: int | None = None, progress: bool = True) -> dict:
    """Rewrite every training JPEG of `data_dir` that lacks restart markers; the counts, bytes and seconds, and the
    first files left as they were with why."""
    if jpeg_crop.library() is None:
        raise BadInput(f"cannot rewrite JPEGs here: {jpeg_crop.unavailable()} (Debian and Ubuntu: apt-get install "
                       "gcc libjpeg-dev)")
    started = time.perf_counter()
    removed = remove_leftovers(data_dir)
    paths = list(training_jpegs(data_dir))
    counts, before, after, left = dict.fromkeys((REWRITTEN, ALREADY, LEFT), 0), 0, 0, []
    workers = workers or len(os.sched_getaffinity(0))
    try:
        with writer_pool(workers if len(paths) > CHUNK else 1) as pool, files_bar(progress) as bar:
            task = bar.add_task("adding restart markers", total=len(paths))
            chunks = [paths[i:i + CHUNK] for i in range(0, len(paths), CHUNK)]
            for done in (pool.imap(rewrite_files, chunks) if pool else map(rewrite_files, chunks)):
                for path, outcome in done:
                    counts[outcome.kind] += 1
                    before, after = before + outcome.before, after + outcome.after
                    if outcome.kind == LEFT:
                        left.append((path, outcome.why))
                bar.update(task, advance=len(done))
    finally:  # an interrupt stops the writers wherever they are: a temporary file may be left, never a half file
        remove_leftovers(data_dir)
    return {"folder": str(data_dir), "files": len(paths), **counts, "bytes_before": before, "bytes_after": after,
            "seconds": time.perf_counter() - started, "left": left, "leftovers_removed": removed}


def rewrite_files(paths: list[str]) -> list[tuple[str, Outcome]]:
    """rewrite_file for each path (a writer's unit of work)."""
    return [(path, rewrite_file(Path(path))) for path in paths]


def rewrite_file(path: Path) -> Outcome:
    """The JPEG at `path` with a restart marker after every MCU, checked to decode to the same pixels, put in its
    place whole (its permissions kept); a file that already has them, or cannot have them, is left as it was."""
    data = path.read_bytes()
    shape = jpeg_crop.info(data)
    if shape is None:
        return Outcome(LEFT, len(data), len(data), "not a JPEG")
    if jpeg_crop.cuttable(data):
        return Outcome(ALREADY, len(data), len(data))
    if shape[2] not in (1, 3):
        why = f"CMYK or YCCK ({shape[2]} components): the fast loader decodes it through PIL"
        return Outcome(LEFT, len(data), len(data), why)
    try:
        rewritten = jpeg_crop.add_restarts(data)
    except jpeg_crop.JpegError as exc:
        return Outcome(LEFT, len(data), len(data), f"libjpeg refused it: {exc}")
    if pixels(rewritten) != pixels(data):
        return Outcome(LEFT, len(data), len(data), "the rewrite would not decode to the same pixels")
    replace_whole(path, rewritten)
    return Outcome(REWRITTEN, len(data), len(rewritten))


def pixels(data: bytes) -> tuple[str, tuple[int, int], bytes] | None:
    """A JPEG's decoded mode, size and pixels, as PIL (the pil loader) decodes it; None when PIL cannot."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.mode, img.size, img.tobytes()
    except Exception:  # noqa: BLE001 - any failure to decode: not the same pixels
        return None


def replace_whole(path: Path, data: bytes) -> None:
    """`data` in place of the file at `path`, written to a temporary sibling first (its permissions copied), then
    renamed over it: never half written."""
    temporary = path.with_name(f".{path.name}{TEMPORARY}")
    try:
        temporary.write_bytes(data)
        os.chmod(temporary, path.stat().st_mode & 0o7777)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)

