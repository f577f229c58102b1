"""Decoding a data set's images, and the list of those that cannot be decoded, without torch.

Images may be RGB, grayscale (8 or 16 bit), CMYK, RGBA or palette images: all are read as RGB. An image that cannot
be decoded (corrupt, or more pixels than PIL's guard against decompression bombs allows) is never skipped silently:
`find_bad_images` lists every such file with its reason, and the trainer either refuses them all in one line (naming
a list file, `write_bad_list`) or, asked to, trains without them and says so.

PIL and numpy are imported inside the functions that decode: listing a data set (what the staging step asks of this
program on every run) needs neither, and skipping them halves its start-up.
"""

import re
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from nodelib.cores import usable_cores
from nodelib.errors import UsageError, first_line

T = TypeVar("T")
R = TypeVar("R")
SHOWN = 20  # bad files printed one per line; the list file holds them all
CHUNK = 4096  # images handed to the thread pool at a time (a future per image of a million would cost gigabytes)


class BadImage(UsageError):
    """An image that cannot be decoded: the message names the file and the fix; `reason` says why, without
    the path (what a list of bad files shows beside it)."""

    def __init__(self, message: str, path: str = "", reason: str = ""):
        super().__init__(message)  # one positional argument: a DataLoader worker re-raises it as cls(text)
        self.path, self.reason = path, reason or message


@contextmanager
def opened(path: str, action: str = "decode"):
    """The PIL image at `path`; any failure to open or decode it (in the `with` body too) is a UsageError that
    names the file and why. Decoders fail in many ways (OSError, SyntaxError, struct.error, EOFError, ...)."""
    from PIL import Image

    warnings.simplefilter("error", Image.DecompressionBombWarning)  # refused by name, not decoded for minutes
    try:
        with Image.open(path) as img:
            yield img
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        pixels = re.search(r"\((\d+) pixels\)", str(exc))
        why = (
            f"{int(pixels.group(1)) if pixels else 'too many'} pixels, more than the {Image.MAX_IMAGE_PIXELS} "
            "that decoding allows (a guard against decompression bombs)"
        )
        raise BadImage(f"image {path} has {why}; shrink it or remove the file", path, why) from None
    except Exception as exc:
        why = first_line(exc)
        raise BadImage(
            f"cannot {action} image {path} ({why}); replace or remove the file", path, why.replace(f" '{path}'", "")
        ) from None  # PIL names the file: the list already does


def load_rgb(path: str):
    """Decode an image as RGB (a PIL image), whatever its mode; a corrupt file is a UsageError naming it."""
    with opened(path) as img:
        if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
            img = img.convert("RGBA")
        elif img.mode.startswith("I") or img.mode == "F":
            img = _to_8_bit(img)
        return img.convert("RGB")


def _to_8_bit(img):
    """16-bit and float grayscale to 8 bits (PIL's own conversion clips everything above 255)."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(img, dtype=np.float32)
    peak = 65535.0 if img.mode.startswith("I;16") or pixels.max() > 255 else 255.0
    return Image.fromarray(np.clip(pixels * (255.0 / peak), 0, 255).astype(np.uint8), mode="L")


def check_image(path: str) -> None:
    """Decode an image fully enough to find truncation or corruption (JPEGs at reduced scale: fast)."""
    with opened(path) as img:
        img.draft("RGB", (64, 64))  # JPEG only: DCT scaling still reads every byte of the scan
        img.load()


def check_header(path: str) -> None:
    """Check that a file is an image of a known format, reading its header only (fast)."""
    with opened(path, "read") as img:
        img.verify()


def verify_images(samples: list[tuple[str, int]], rank: int = 0, world_size: int = 1, decode: bool = True) -> int:
    """Decode (or with decode=False, header-check) this worker's share of the images, on all cores."""
    mine = [path for path, _ in samples[rank::world_size]]
    with ThreadPoolExecutor(max_workers=usable_cores()) as pool:
        list(pool.map(check_image if decode else check_header, mine))  # PIL decodes without the GIL
    return len(mine)


def image_problem(path: str, decode: bool = True) -> str | None:
    """Why the image at `path` cannot be decoded (decode=False: read as an image by its header), or None."""
    try:
        (check_image if decode else check_header)(path)
    except BadImage as exc:
        return exc.reason
    return None


def find_bad_images(paths: list[str], decode: bool = True) -> list[tuple[str, str]]:
    """Every image of `paths` that cannot be decoded, as (path, reason) in the order given, checked on all
    cores (PIL decodes without the GIL; JPEGs at reduced scale, as check_image does)."""
    bad = []
    for start in range(0, len(paths), CHUNK):
        chunk = paths[start : start + CHUNK]
        reasons = on_all_cores(lambda path: image_problem(path, decode), chunk)
        bad += [(path, why) for path, why in zip(chunk, reasons) if why is not None]
    return bad


def on_all_cores(work: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`work` of each item, in threads on every core (for work that releases the GIL: decoding, hashing). An
    interrupt (Ctrl-C) drops the work not yet started: it waits for at most one item per core, not for the rest."""
    pool = ThreadPoolExecutor(max_workers=usable_cores())
    try:
        return list(pool.map(work, items))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def one_line(text: str) -> str:
    """`text` with its tabs and line breaks as spaces: a reason must stay one field of one line."""
    return " ".join(text.split()) if not text.isprintable() else text


def write_bad_list(bad: list[tuple[str, str]], dest: Path) -> Path:
    """Write `bad` to `dest` as TSV, one `path<TAB>reason` per line (names hold no tab: check_name); `dest`."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(f"{path}\t{one_line(why)}\n" for path, why in bad), encoding="utf-8")
    return dest


def read_bad_list(path: Path) -> list[tuple[str, str]]:
    """The (path, reason) pairs of a list that write_bad_list wrote."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [(name, why) for name, why in (line.split("\t", 1) for line in lines if line)]


def bad_image_lines(bad: list[tuple[str, str]], shown: int = SHOWN) -> list[str]:
    """The first `shown` bad images, one line each, and how many more the list holds."""
    lines = [f"cannot decode {path}: {one_line(why)}" for path, why in bad[:shown]]
    return lines + ([f"... and {len(bad) - shown} more"] if len(bad) > shown else [])


def bad_images_error(
    bad: list[tuple[str, str]],
    checked: int,
    listing: Path | None = None,
    folder: Path | str = "",
    verb: str = "decoded",
) -> UsageError:
    """The one-line error for a non-empty list of bad images: how many of how many checked (in `folder`), the
    first, the list file (None: the one file is named here and listed nowhere else) and the two fixes."""
    n, (path, why) = len(bad), bad[0]
    where = f" in {folder}" if str(folder) else ""
    head = f"{n} of {checked} images{where} cannot be {verb} ({'' if n == 1 else 'first: '}{path}: {one_line(why)})"
    listed = "" if listing is None else f"; {'it is' if n == 1 else f'all {n} are'} listed in {listing}"
    them = "it" if n == 1 else "them"
    return UsageError(
        f"{head}{listed}; replace or remove {them}, or pass --bad-files skip (training.bad_files: "
        f"skip) to train without {them}"
    )
