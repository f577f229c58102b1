"""The ImageNet folder layout: which files a data set holds, checked, without torch.

Layout: DATA/train/<class>/**/<image> and, optionally, DATA/val/<class>/**/<image>. Class folders may
nest sub-folders; names may hold spaces and any unicode. Images may be RGB, grayscale (8 or 16 bit),
CMYK, RGBA or palette images: all are read as RGB. Files whose names start with "." are ignored.
A corrupt image is an error that names the file; it is never skipped silently.

The staging step runs this module as a program, so that data is checked by the same rules the
training engine applies, without importing the engine:

    python containers/trainer/layout.py DATA [--verify-list FILE [--headers-only]]

prints {"classes": [...], "train": [[path, label], ...], "val": [...] or null} as JSON, decoding the
images listed in FILE (one path relative to DATA per line; --headers-only reads just their headers);
bad data exits with status 2 and one line.
"""

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
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
    if not data_dir.is_dir():
        raise UsageError(
            f"data folder {data_dir} does not exist; point --data at a folder holding train/<class>/ images"
        )
    train_dir = data_dir / "train"
    if not train_dir.is_dir() or not _class_dirs(train_dir):
        raise UsageError(
            f"data folder {data_dir} is empty or has no train/<class>/ folders; "
            "lay it out as train/<class>/<image> (and val/<class>/<image>)"
        )
    train = index_split(train_dir, None)
    val_dir = data_dir / "val"
    if val_dir.is_dir() and not _class_dirs(val_dir):
        raise UsageError(f"{val_dir} has no class folders; add val/<class>/ images or remove val/")
    val = index_split(val_dir, train.classes) if val_dir.is_dir() else None
    return train, val


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


def _class_dirs(split_dir: Path) -> list[Path]:
    return sorted(d for d in split_dir.iterdir() if d.is_dir() and not d.name.startswith("."))


def _image_files(class_dir: Path) -> list[Path]:
    """Every image under a class folder, recursively; anything else that is not hidden is an error."""
    files = []
    for root, dirs, names in os.walk(class_dir, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".")):
            path = Path(root, name)
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                raise UsageError(f"{path} is not an image file; remove it or move it out of the data folder")
            if not os.access(path, os.R_OK):
                raise UsageError(f"cannot read {path} (permission denied); fix its permissions or remove it")
            files.append(path)
    return files


def load_rgb(path: str):
    """Decode an image as RGB (a PIL image), whatever its mode; a corrupt file is a UsageError naming it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
                img = img.convert("RGBA")
            elif img.mode.startswith("I") or img.mode == "F":
                img = _to_8_bit(img)
            return img.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise UsageError(f"cannot decode image {path} ({exc}); replace or remove the file") from None


def _to_8_bit(img):
    """16-bit and float grayscale to 8 bits (PIL's own conversion clips everything above 255)."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(img, dtype=np.float32)
    peak = 65535.0 if img.mode.startswith("I;16") or pixels.max() > 255 else 255.0
    return Image.fromarray(np.clip(pixels * (255.0 / peak), 0, 255).astype(np.uint8), mode="L")


def check_image(path: str) -> None:
    """Decode an image fully enough to find truncation or corruption (JPEGs at reduced scale: fast)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.draft("RGB", (64, 64))  # JPEG only: DCT scaling still reads every byte of the scan
            img.load()
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise UsageError(f"cannot decode image {path} ({exc}); replace or remove the file") from None


def check_header(path: str) -> None:
    """Check that a file is an image of a known format, reading its header only (fast)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.verify()
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise UsageError(f"cannot read image {path} ({exc}); replace or remove the file") from None


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
