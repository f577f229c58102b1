"""The sizes of a few training images of a data folder, read from their headers: what the recipe a run gets is
picked from (flows/recipes.py). Reading a header costs a file open and a few hundred bytes, so a sample of an
ImageNet-sized folder takes milliseconds; nothing here refuses a folder (the layout check does, by name)."""

import itertools
import math
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from nodelib.layout import IMAGE_SUFFIXES

SAMPLED = 32  # images whose headers are read: enough for a median, few enough to take milliseconds


def sample_image_sizes(data_dir: Path, count: int = SAMPLED) -> list[tuple[int, int]]:
    """(width, height) of up to `count` images of DATA/train, spread over its class folders; a file that cannot be
    read as an image is passed over, and a folder without train/ gives none."""
    sizes = (header_size(path) for path in sample_files(data_dir / "train", count))
    return [size for size in sizes if size is not None]


def sample_files(train: Path, count: int) -> list[Path]:
    """Up to `count` image files of `train`, the first few of class folders spread evenly over the sorted classes
    (the first class alone may be untypical of the set)."""
    try:
        classes = sorted(e.path for e in os.scandir(train) if e.is_dir() and not e.name.startswith("."))
    except OSError:  # no train/ folder: the layout check names it
        return []
    spread = min(count, len(classes))
    chosen = [classes[i * len(classes) // spread] for i in range(spread)]
    per_class = math.ceil(count / spread) if spread else 0
    files = itertools.chain.from_iterable(itertools.islice(image_files(Path(c)), per_class) for c in chosen)
    return list(itertools.islice(files, count))


def image_files(folder: Path) -> Iterator[Path]:
    """The image files under `folder` by their suffix (the layout's), in a stable order: regular files only (opening
    a named pipe would wait for a writer forever), hidden ones left out, linked folders not followed (a loop)."""
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = Path(root, name)
            if not name.startswith(".") and path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                yield path


def header_size(path: Path) -> tuple[int, int] | None:
    """The image's (width, height) from its header alone (PIL decodes no pixels until asked); None when it is no
    image PIL reads."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # a large photo is still a photo
            with Image.open(path) as img:
                return img.size
    except Exception:  # unreadable, truncated or no image at all: the staging scan names such a file
        return None
