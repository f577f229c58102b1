"""Images shrunk once at staging (`--max-side N`): a mirror of the data folder in which every JPEG or PNG whose
longer side exceeds N is re-encoded at N (a PNG as a PNG: lossless, its name still true), and every other file is a
hard link to the user's own.

Decoding a 500 px JPEG costs a fraction of a 2,000 px one, and a 224 px training crop still has pixels to spare: FFCV
stores ImageNet for ResNet-50 at a 500 px longer side for this reason. The user's folder is only read: the mirror
lives under the work folder, keyed by data set name and N, and staging reads it instead.

`shrink_jpeg` is pure Pillow (it runs on the GPU machine too, where only torch, torchvision, Pillow and numpy are):
quality 90, aspect kept, Lanczos, the pixels kept as stored and the EXIF orientation tag carried over (the rest of
the EXIF dropped): no loader applies that tag, as neither torchvision nor Keras do, so a shrunk photo and one kept as
it is reach the model alike. CMYK and YCCK made RGB, gray kept gray, the ICC profile kept (dropped with CMYK), a
restart marker after every MCU so that the fast loader decodes only each crop's MCUs. The same input gives the same
bytes.

`shrunk_copy` keeps the mirror: each file written has its source's mtime (a link shares it), so an unchanged re-run
rewrites nothing and the index's size+mtime cache holds; a changed source is written again, a removed one removed
from the mirror; each file is written whole (a temporary sibling, then a rename: a link is never written through),
so an interrupt never leaves a half file under a real name.
"""

import errno
import functools
import io
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from PIL import Image

from nodelib.cores import usable_cores

QUALITY = 90
MIN_SIDE = 32  # the smallest --max-side (the digits set's side): a smaller one is a typo, not a training choice
TEMPORARY = ".shrink-tmp"  # the suffix of a file being written; one left by a killed run is removed by the next
CHUNK = 64  # files per unit of work handed to a writer process
SHRUNK, LINKED, COPIED, KEPT = "shrunk", "linked", "copied", "unchanged"
JPEG_START = b"\xff\xd8\xff"
PNG_START = b"\x89PNG\r\n\x1a\n"
PNG_MODES = ("L", "LA", "RGB", "RGBA")  # kept as they are; any other (palette, 1-bit, 16-bit) made RGB(A), as trained
ORIENTATION = 0x0112  # the EXIF tag of how a viewer turns the stored pixels


def shrink_jpeg(data: bytes, max_side: int) -> bytes | None:
    """`data` re-encoded with its longer side at `max_side`; None when it needs no change:
    not a JPEG, small enough, or not decodable (the scan flags bad files as it always has)."""
    if not data.startswith(JPEG_START):
        return None
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format != "JPEG" or max(img.size) <= max_side:
                return None
            return _encoded(_resized(img, max_side), img.info.get("icc_profile"), img.getexif().get(ORIENTATION))
    except Exception:  # anything PIL cannot decode is the scan's to report, not this step's
        return None


def shrink_image(data: bytes, max_side: int) -> bytes | None:
    """`data` with its longer side at `max_side` when it is a JPEG or a PNG larger than that; None when it needs no
    change (another format, small enough, or not decodable: the scan flags bad files as it always has)."""
    return shrink_png(data, max_side) if data.startswith(PNG_START) else shrink_jpeg(data, max_side)


def shrink_png(data: bytes, max_side: int) -> bytes | None:
    """A PNG larger than `max_side` re-encoded as a PNG at it (Lanczos; transparency kept); None when it needs no
    change."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format != "PNG" or max(img.size) <= max_side:
                return None
            pixels = img if img.mode in PNG_MODES else img.convert("RGBA" if "transparency" in img.info else "RGB")
            out = io.BytesIO()
            pixels.resize(fitted(pixels.size, max_side), Image.Resampling.LANCZOS).save(out, "PNG")
            return out.getvalue()
    except Exception:  # anything PIL cannot decode is the scan's to report, not this step's
        return None


def _resized(img: Image.Image, max_side: int) -> Image.Image:
    """`img` in RGB or gray, its longer side at `max_side` (Lanczos, from a DCT-scaled decode at >= 2x)."""
    scale = max_side / max(img.size)
    img.draft(img.mode, (math.ceil(img.width * scale * 2), math.ceil(img.height * scale * 2)))
    pixels = img if img.mode in ("L", "RGB") else img.convert("RGB")  # CMYK, YCCK (PIL decodes it as CMYK)
    return pixels.resize(fitted(pixels.size, max_side), Image.Resampling.LANCZOS)


def fitted(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """`size` scaled so that its longer side is `max_side`, the aspect kept."""
    w, h = size
    return (max_side, max(1, round(h * max_side / w))) if w >= h else (max(1, round(w * max_side / h)), max_side)


def _encoded(img: Image.Image, icc: bytes | None, orientation: int | None) -> bytes:
    """`img` as a baseline JPEG, quality 90, optimised Huffman tables, a restart marker after every MCU, no EXIF but
    the orientation tag (so that a viewer shows it as it showed the original); an ICC profile kept unless the colours
    were converted from CMYK."""
    out = io.BytesIO()
    extra: dict = {"icc_profile": icc} if icc and img.mode in ("L", "RGB") and not _is_cmyk_profile(icc) else {}
    if orientation not in (None, 1):
        exif = Image.Exif()
        exif[ORIENTATION] = orientation
        extra["exif"] = exif.tobytes()
    img.save(out, "JPEG", quality=QUALITY, optimize=True, restart_marker_blocks=1, **extra)
    return out.getvalue()


def _is_cmyk_profile(icc: bytes) -> bool:
    """Whether an ICC profile describes CMYK colours (its header's colour space field, bytes 16-19)."""
    return icc[16:20] == b"CMYK"


def check_max_side(value: object) -> int:
    """`value` as a --max-side: an integer >= MIN_SIDE, else ValueError saying what to give."""
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_SIDE:
        raise ValueError(
            f"max_side must be a whole number of pixels, at least {MIN_SIDE} (500 is what FFCV uses for "
            f"ResNet-50 on ImageNet), not {value!r}"
        )
    return value


class Outcome(NamedTuple):
    """What became of one file: SHRUNK, LINKED, COPIED or KEPT (already up to date), its source's size and the
    size of its copy in the mirror."""

    kind: str
    source: int
    mirror: int


def shrunk_copy(
    src: Path,
    dest: Path,
    max_side: int,
    paths: Iterable[str] | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> dict:
    """Bring the mirror `dest` of `src` up to date: each of `paths` (relative to src; default every file under it)
    shrunk to `max_side` when it is a big JPEG, hard-linked (copied where it cannot be) otherwise; mirror files
    whose source is gone removed. The counts, bytes and seconds."""
    from infra.data.sample_data import files_bar, writer_pool  # rich: the orchestrator's only, not the GPU machine's

    started, src, dest = time.perf_counter(), src.resolve(), dest.resolve()
    if dest == src or dest in src.parents:
        raise ValueError(f"the shrunk copy {dest} cannot be the data folder {src} or hold it")
    dest.mkdir(parents=True, exist_ok=True)
    chunks = list(_chunks(_relative_files(src, dest) if paths is None else paths))
    counts, before, after = dict.fromkeys((SHRUNK, LINKED, COPIED, KEPT), 0), 0, 0
    mirror = functools.partial(mirror_files, str(src), str(dest), max_side)
    workers = workers or usable_cores()
    try:
        with writer_pool(workers if len(chunks) > 1 else 1) as pool, files_bar(progress) as bar:
            task = bar.add_task(f"shrinking to {max_side} px", total=sum(map(len, chunks)))
            for done in pool.imap_unordered(mirror, chunks) if pool else map(mirror, chunks):
                for outcome in done:
                    counts[outcome.kind] += 1
                    before, after = before + outcome.source, after + outcome.mirror
                bar.update(task, advance=len(done))
    finally:  # an interrupt stops the writers wherever they are: a temporary file may be left, never a half file
        removed = remove_stale(src, dest)
    return {
        "source": str(src),
        "mirror": str(dest),
        "max_side": max_side,
        "files": sum(map(len, chunks)),
        **counts,
        "removed": removed,
        "bytes_source": before,
        "bytes_mirror": after,
        "seconds": time.perf_counter() - started,
    }


def _relative_files(root: Path, mirror: Path) -> Iterator[str]:
    """Every file under `root` (links to files followed), relative to it; none of the mirror's, where it lies
    inside (a work folder inside the data folder)."""
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if Path(folder, name) != mirror]
        base = Path(folder).relative_to(root)
        yield from (str(base / name) for name in names if os.path.isfile(os.path.join(folder, name)))


def _chunks(paths: Iterable[str]) -> Iterator[list[str]]:
    """`paths` in lists of CHUNK."""
    batch: list[str] = []
    for path in paths:
        batch.append(path)
        if len(batch) == CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def mirror_files(src: str, dest: str, max_side: int, paths: list[str]) -> list[Outcome]:
    """mirror_file for each path (a writer's unit of work)."""
    return [mirror_file(Path(src, path), Path(dest, path), max_side) for path in paths]


def mirror_file(source: Path, copy: Path, max_side: int) -> Outcome:
    """`copy` made the mirror of `source`: kept when it is up to date, else shrunk, or linked."""
    found = source.stat()
    existing = _copy_stat(copy)
    if existing is not None and _up_to_date(existing, found, source, max_side):
        return Outcome(KEPT, found.st_size, existing.st_size)
    copy.parent.mkdir(parents=True, exist_ok=True)
    data = source.read_bytes()
    shrunk = shrink_image(data, max_side)
    if shrunk is not None:
        _write_whole(copy, lambda tmp: tmp.write_bytes(shrunk), found)
        return Outcome(SHRUNK, len(data), len(shrunk))
    kind = _write_whole(copy, lambda tmp: _link_or_copy(source, tmp), found)
    return Outcome(kind, len(data), len(data))


def _copy_stat(copy: Path) -> os.stat_result | None:
    """The mirror file's status; None when it is missing."""
    try:
        return copy.lstat()
    except FileNotFoundError:
        return None


def _up_to_date(existing: os.stat_result, found: os.stat_result, source: Path, max_side: int) -> bool:
    """Whether the mirror's file still stands for its source: a written one has its source's mtime; a hard link
    follows its source, unless the source was rewritten in place into a JPEG to shrink (its header says)."""
    if (existing.st_ino, existing.st_dev) == (found.st_ino, found.st_dev):
        return not _too_big(source, max_side)
    return existing.st_mtime_ns == found.st_mtime_ns


def _too_big(path: Path, max_side: int) -> bool:
    """Whether the file is a JPEG or PNG with a side over `max_side`, from its header alone."""
    try:
        with open(path, "rb") as f:
            start = f.read(8)
            if not start.startswith(JPEG_START) and start != PNG_START:
                return False
            f.seek(0)
            with Image.open(f) as img:
                return img.format in ("JPEG", "PNG") and max(img.size) > max_side
    except Exception:  # not decodable: the scan reports it
        return False


def out_of_date(src: Path, dest: Path, max_side: int, paths: Iterable[str]) -> tuple[int, int]:
    """What `shrunk_copy` would do, read from the files' status and headers (the dry run): the files it would
    write, of how many."""
    todo = total = 0
    for path in paths:
        existing, total = _copy_stat(dest / path), total + 1
        todo += existing is None or not _up_to_date(existing, (src / path).stat(), src / path, max_side)
    return todo, total


def _link_or_copy(source: Path, tmp: Path) -> str:
    """`tmp` made a hard link to `source`, or a copy of it (mtime kept) where a link is impossible (another file
    system, a file another user owns under protected_hardlinks); LINKED or COPIED."""
    tmp.unlink()
    try:
        os.link(source, tmp)
        return LINKED
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP):
            raise
    shutil.copy2(source, tmp)
    return COPIED


def _write_whole(copy: Path, fill, found: os.stat_result):
    """`fill(tmp)` on a temporary sibling of `copy`, the source's mtime given to a written (not linked) file, then
    renamed to `copy` (so a hard link is never written through); what `fill` returned."""
    fd, name = tempfile.mkstemp(prefix=".", suffix=TEMPORARY, dir=copy.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        result = fill(tmp)
        if result != LINKED:
            os.chmod(tmp, 0o644)
            os.utime(tmp, ns=(found.st_atime_ns, found.st_mtime_ns))
        os.replace(tmp, copy)
        return result
    finally:
        tmp.unlink(missing_ok=True)


def remove_stale(src: Path, dest: Path) -> int:
    """Remove from the mirror the files whose source is gone (or is no longer a file), the temporary files a killed
    run left, and the folders left empty; how many files (temporary ones not counted)."""
    removed = 0
    for path in stale_files(src, dest):
        path.unlink(missing_ok=True)
        removed += not path.name.endswith(TEMPORARY)
        folder = path.parent
        while folder != dest and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
    return removed


def stale_files(src: Path, dest: Path) -> Iterator[Path]:
    """The mirror's files whose source is gone (or is no longer a file), and temporary files a killed run left."""
    for folder, _, names in os.walk(dest):
        here = Path(folder)
        for name in names:
            if name.endswith(TEMPORARY) or not (src / (here / name).relative_to(dest)).is_file():
                yield here / name
