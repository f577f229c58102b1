"""What `trainflow predict` does whatever the framework: the images it is given, listed; each decoded and transformed
as the model's validation did, on all cores, those that cannot be decoded named and skipped as training skips them
(--bad-files skip); batches of the rest classified; the top classes of each. Imports neither torch nor TensorFlow:
a `Classifier` brings its framework (trainer/predict.py for PyTorch's models, trainer/tf/predict.py for Keras's).
"""

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nodelib.cores import usable_cores
from nodelib.errors import UsageError
from nodelib.image_files import BadImage, bad_image_lines
from nodelib.layout import IMAGE_SUFFIXES, entry_kind, special_name

BATCH = 64  # images classified at once: the model's memory for them stays small on any device


@dataclass(frozen=True)
class Prediction:
    """The classes an image most likely shows, with their probabilities, the likeliest first."""

    file: str
    top: list[tuple[str, float]]

    def record(self) -> dict:
        """As `trainflow predict --json` prints it."""
        return {"file": self.file, "top": [{"class": name, "probability": p} for name, p in self.top]}


class Classifier(Protocol):
    """A model loaded for prediction, with its own evaluation transform."""

    classes: list[str]  # the class names, label by label

    def prepare(self, path: str) -> Any:
        """The image at `path` as the model's validation saw it; BadImage when it cannot be decoded."""

    def probabilities(self, images: list) -> Any:
        """A batch of prepared images' class probabilities: a (len(images), len(classes)) float array."""


def image_paths(inputs: list[Path]) -> list[str]:
    """The images of `inputs`: each file as given (whatever its name: one that is no image is named when it fails
    to decode), each folder's image files, recursively, hidden ones skipped, sorted; none: one line saying so."""
    paths: list[str] = []
    for given in inputs:
        kind = entry_kind(given)  # a broken or looping link: an error naming it
        if kind == "folder":
            paths += folder_images(given)
        elif kind == "file":
            paths.append(str(given))
        elif kind == "special":
            raise not_an_image(given)
        else:
            raise UsageError(f"{given}: no such file or folder; pass image files or folders of them")
    if not paths:
        where = ", ".join(str(given) for given in inputs)
        suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
        raise UsageError(
            f"no images in {where} (no file there ends in {suffixes}); pass image files or folders of them"
        )
    return paths


def folder_images(folder: Path) -> list[str]:
    """The image files under `folder` by their suffix, recursively (linked folders too, each real folder once),
    sorted; names starting with "." skipped, as in a data set (.DS_Store, .verified.json, hidden folders). A broken
    link or a named pipe, socket or device with an image's name is an error naming it (a FIFO is never opened: it
    would wait for a writer forever)."""
    found, seen = [], set()
    for top, folders, files in os.walk(folder, followlinks=True):
        if (real := os.path.realpath(top)) in seen:  # a link back up the tree: walked once
            folders[:] = []
            continue
        seen.add(real)
        folders[:] = [name for name in folders if not name.startswith(".")]
        for name in files:
            path = Path(top, name)
            if name.startswith(".") or path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            if entry_kind(path) == "special":
                raise not_an_image(path)
            found.append(str(path))
    return sorted(found)


def not_an_image(path: Path) -> UsageError:
    """The error for a special file where an image was to be read."""
    return UsageError(f"{path} is a {special_name(path)}, not an image file; remove it or move it out of the folder")


def classify(
    classifier: Classifier,
    paths: list[str],
    top_k: int,
    skipped: Callable[[str], None],
    advance: Callable[[int], None] = lambda n: None,
) -> list[Prediction]:
    """The `top_k` classes of each image of `paths` that decodes, in order, BATCH at a time; each one that does not
    is named in a line to `skipped`; `advance` is told how many were done after each batch. None decoded: one line."""
    predictions: list[Prediction] = []
    with ThreadPoolExecutor(max_workers=usable_cores()) as pool:  # PIL and TensorFlow decode without the GIL
        for start in range(0, len(paths), BATCH):
            kept, images = prepared(classifier, paths[start : start + BATCH], pool, skipped)
            if images:
                rows = classifier.probabilities(images)
                predictions += [Prediction(path, top(row, classifier.classes, top_k)) for path, row in zip(kept, rows)]
            advance(len(paths[start : start + BATCH]))
    if not predictions:
        given = "the one file given cannot" if len(paths) == 1 else f"none of the {len(paths)} files given can"
        raise UsageError(f"no images to classify: {given} be decoded (named above); pass image files")
    return predictions


def prepared(
    classifier: Classifier, paths: list[str], pool: ThreadPoolExecutor, skipped: Callable[[str], None]
) -> tuple[list[str], list]:
    """(paths, images): those of `paths` that decode, prepared for the model; the others named to `skipped`."""

    def attempt(path: str):
        try:
            return classifier.prepare(path)
        except BadImage as bad:
            return bad

    kept, images = [], []
    for path, image in zip(paths, pool.map(attempt, paths)):
        if isinstance(image, BadImage):
            skipped(f"{bad_image_lines([(path, image.reason)])[0]}; skipped")
        else:
            kept.append(path)
            images.append(image)
    return kept, images


def top(row, classes: list[str], k: int) -> list[tuple[str, float]]:
    """The `k` likeliest classes of one image's probabilities `row`, the likeliest first (ties: the lower label, as
    validation's argmax picks it)."""
    ranked = sorted(range(len(classes)), key=lambda label: -float(row[label]))[:k]
    return [(classes[label], round(float(row[label]), 6)) for label in ranked]
