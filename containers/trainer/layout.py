"""The ImageNet folder layout: which files a data set holds, checked, without torch.

Layout: DATA/train/<class>/**/<image> and, optionally, DATA/val/<class>/**/<image>, with at least 2
classes. Class folders may nest sub-folders and symlinks (followed; a broken one or a loop is an error
naming the link); names may hold spaces and any unicode but control characters. Images may be RGB,
grayscale (8 or 16 bit), CMYK, RGBA or palette images: all are read as RGB. Files whose names start
with "." are ignored. An image that cannot be decoded (corrupt, or more pixels than PIL's guard against
decompression bombs allows) is an error that names the file; it is never skipped silently.

The staging step runs this module as a program, so that data is checked by the same rules the
training engine applies, without importing the engine:

    python containers/trainer/layout.py DATA [--verify-list FILE [--headers-only]]

prints {"classes": [...], "train": [[path, label], ...], "val": [...] or null} as JSON, decoding the
images listed in FILE (one path relative to DATA per line; --headers-only reads just their headers);
bad data exits with status 2 and one line.
"""

import argparse
import errno
import json
import os
import re
import stat
import sys
import unicodedata
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `trainer` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.errors import UsageError

# PIL and numpy are imported inside the functions that decode: listing a data set (what the staging
# step asks of this program on every run) needs neither, and skipping them halves its start-up.

IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".pbm", ".gif", ".tif", ".tiff", ".webp"}
)


@dataclass(frozen=True)
class Split:
    """The images of one split: (path, class index) pairs and the class names, sorted."""

    classes: list[str]
    samples: list[tuple[str, int]]


def index_folder(data_dir: Path) -> tuple[Split, Split | None]:
    """Index DATA/train and DATA/val, checking the layout; val is None when absent."""
    kind = entry_kind(data_dir)
    if kind != "folder":
        what = "is a file, not a folder" if kind == "file" else "does not exist"
        raise UsageError(f"data folder {data_dir} {what}; point --data at a folder holding train/<class>/ images")
    train_dir, val_dir = data_dir / "train", data_dir / "val"
    if entry_kind(train_dir) != "folder" or not _class_dirs(train_dir):
        raise UsageError(
            f"data folder {data_dir} is empty or has no train/<class>/ folders; "
            "lay it out as train/<class>/<image> (and val/<class>/<image>)"
        )
    train = index_split(train_dir, None)
    check_classes(data_dir, train.classes)
    val_kind = entry_kind(val_dir)
    if val_kind == "missing":
        return train, None
    if val_kind == "file" or not _class_dirs(val_dir):
        raise UsageError(f"{val_dir} has no class folders; add val/<class>/ images or remove val/")
    return train, index_split(val_dir, train.classes)


def check_classes(data_dir: Path, classes: list[str]) -> None:
    """A classifier of one class learns nothing (its loss is 0 from the first step): refuse it."""
    if len(classes) == 1:
        raise UsageError(f"data folder {data_dir} has 1 class ({classes[0]}) under train/; a classifier needs at "
                         "least 2: add another train/<class>/ folder of images")


def index_split(split_dir: Path, classes: list[str] | None) -> Split:
    """List one split's images; `classes` (from train) fixes the label of each class folder."""
    found = [d.name for d in _class_dirs(split_dir)]
    classes = classes if classes is not None else found
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise UsageError(
            f"{split_dir} has class folders that train/ lacks: {', '.join(unknown[:5])}; "
            "add them to train/ or remove them"
        )
    samples = []
    for name in found:
        files = _image_files(split_dir / name)
        if not files:
            raise UsageError(f"class folder {split_dir / name} has no images; add images or remove the folder")
        samples += [(str(f), classes.index(name)) for f in files]
    return Split(classes=classes, samples=samples)


def entry_kind(path: Path) -> str:
    """"folder", "file" or "missing"; a symlink that loops or leads nowhere is an error that names it."""
    try:
        return "folder" if stat.S_ISDIR(os.stat(path).st_mode) else "file"
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(path):
            raise UsageError(f"{path} is a broken symlink (its target {_target(path)} does not exist); "
                             "restore the target or remove the link") from None
        return "missing"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{path} is a symlink loop (it points to {_target(path)}, which leads back to itself); "
                             "remove the link or point it at a real folder or image") from None
        raise UsageError(f"cannot read {path} ({exc.strerror}); fix its permissions or remove it") from None


def _target(link: Path) -> str:
    """Where a symlink points, as written in the link."""
    try:
        return os.readlink(link)
    except OSError:
        return "?"


def check_name(name: str, folder: Path | str = "") -> None:
    """The one rule for the names of a data set's files and folders (the orchestrator imports it): valid UTF-8,
    no control character. The staging lists names one per line, and every message shows a name on one line."""
    if name.isprintable():  # the common case, in C: no control character, no undecodable byte
        return
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{os.fsencode(os.path.join(folder, name))!r} is not a valid UTF-8 name; rename it") from None
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)  # what splitlines splits
    if bad is not None:
        raise UsageError(f"{os.path.join(folder, name)!r} has a control character ({bad!r}) in its name; "
                         "rename it to printable text")


def _visible(folder: Path) -> list[tuple[Path, str]]:
    """The entries of a folder that do not start with ".", sorted, each with its kind; names and links checked
    (a link costs a stat, other entries none)."""
    try:
        with os.scandir(folder) as found:
            entries = sorted((e for e in found if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError as exc:
        raise UsageError(f"cannot list {folder} ({exc.strerror}); fix its permissions or remove it") from None
    visible = []
    for entry in entries:
        check_name(entry.name, folder)
        path = folder / entry.name
        if entry.is_symlink():
            visible.append((path, entry_kind(path)))
        else:
            visible.append((path, "folder" if entry.is_dir(follow_symlinks=False) else "file"))
    return visible


def _class_dirs(split_dir: Path) -> list[Path]:
    return [path for path, kind in _visible(split_dir) if kind == "folder"]


def _image_files(folder: Path, above: frozenset = frozenset()) -> list[Path]:
    """Every image under a class folder, recursively (links followed); anything else not hidden is an error.
    `above` holds the real paths of the folders walked down to here: a link to one of them, or to a folder
    holding one, would never end."""
    above = above | {os.path.realpath(folder)}
    files, subfolders = [], []
    for path, kind in _visible(folder):
        if kind == "folder" and _holds_any(path, above):
            raise UsageError(f"{path} is a symlink loop (it points to {_target(path)}, a folder that holds it); "
                             "remove the link")
        if kind == "folder":
            subfolders.append(path)
        elif path.suffix.lower() not in IMAGE_SUFFIXES:
            raise UsageError(f"{path} is not an image file; remove it or move it out of the data folder")
        elif not os.access(path, os.R_OK):
            raise UsageError(f"cannot read {path} (permission denied); fix its permissions or remove it")
        else:
            files.append(path)
    return files + [f for sub in subfolders for f in _image_files(sub, above)]


def _holds_any(folder: Path, others: frozenset) -> bool:
    """Whether the real folder behind `folder` is, or holds, one of the real paths `others`."""
    real = os.path.join(os.path.realpath(folder), "")
    return any(os.path.join(other, "").startswith(real) for other in others)


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
        raise UsageError(f"image {path} has {int(pixels.group(1)) if pixels else 'too many'} pixels, more than the "
                         f"{Image.MAX_IMAGE_PIXELS} that decoding allows (a guard against decompression bombs); "
                         "shrink it or remove the file") from None
    except Exception as exc:  # noqa: BLE001 - whatever the decoder raised, the file is what to name
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"cannot {action} image {path} ({why}); replace or remove the file") from None


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
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(check_image if decode else check_header, mine))  # PIL decodes without the GIL
    return len(mine)


def main(argv: list[str] | None = None) -> int:
    """Print the index of DATA as JSON, or one error line and exit status 2."""
    parser = argparse.ArgumentParser(description="Check an ImageNet-layout folder and list its images.")
    parser.add_argument("data", type=Path)
    parser.add_argument("--verify-list", type=Path, help="file of paths (relative to DATA) to decode")
    parser.add_argument("--headers-only", action="store_true", help="check the listed images' headers, not their pixels")
    args = parser.parse_args(argv)
    try:
        train, val = index_folder(args.data)
        if args.verify_list:
            names = [n for n in args.verify_list.read_text(encoding="utf-8").splitlines() if n]
            verify_images([(str(args.data / n), 0) for n in names], decode=not args.headers_only)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    json.dump({"classes": train.classes, "train": train.samples, "val": val.samples if val else None}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
