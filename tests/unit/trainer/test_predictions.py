"""What `trainflow predict` shares across frameworks (trainer/predictions.py), with a stand-in for the model: which
files it classifies, the top k of each, a bad image named and skipped, and one line when nothing is left."""

import os

import numpy as np
import pytest

from nodelib.errors import UsageError
from nodelib.image_files import load_rgb
from tests.fakes.image_files import write_image
from trainer.predictions import BATCH, classify, image_paths, top


class ByMeanColour:
    """A Classifier whose 'model' scores 3 classes by an image's mean red, green and blue: no framework needed."""

    classes = ["red", "green", "blue"]

    def __init__(self):
        self.batches: list[int] = []

    def prepare(self, path: str) -> np.ndarray:
        return np.asarray(load_rgb(path), dtype=np.float64).mean(axis=(0, 1))

    def probabilities(self, images: list) -> np.ndarray:
        self.batches.append(len(images))
        scores = np.stack(images)
        return scores / scores.sum(axis=1, keepdims=True)


def test_a_folder_gives_its_image_files_recursively_sorted_without_hidden_ones(tmp_path):
    for name in ("b.png", "a.JPG", "sub/c.jpeg", "sub/deeper/d.webp", ".hidden.png", ".cache/e.png"):
        (tmp_path / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "photos" / name).write_bytes(b"")
    (tmp_path / "photos" / "notes.txt").write_text("not an image")
    (tmp_path / "loose.txt").write_text("a file named is classified whatever its name")

    found = image_paths([tmp_path / "photos", tmp_path / "loose.txt"])

    photos = tmp_path / "photos"
    expected = [photos / "a.JPG", photos / "b.png", photos / "sub" / "c.jpeg", photos / "sub" / "deeper" / "d.webp"]
    assert found == [*map(str, expected), str(tmp_path / "loose.txt")]


def test_a_linked_subfolder_is_followed_once_and_a_fifo_or_a_broken_link_is_named(tmp_path):
    photos, elsewhere = tmp_path / "photos", tmp_path / "elsewhere"
    (photos / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "far.png").write_bytes(b"")
    (photos / "linked").symlink_to(elsewhere)
    (photos / "sub" / "loop").symlink_to(photos)  # back up the tree: walked once, not forever
    (photos / "a.png").write_bytes(b"")
    assert image_paths([photos]) == [str(photos / "a.png"), str(photos / "linked" / "far.png")]

    (photos / "gone.png").symlink_to(tmp_path / "deleted.png")
    with pytest.raises(UsageError, match=r"gone.png is a broken symlink \(its target .*deleted.png does not exist\)"):
        image_paths([photos])
    (photos / "gone.png").unlink()
    os.mkfifo(photos / "stream.jpg")  # opened, it would wait for a writer forever
    for given in (photos, photos / "stream.jpg"):
        with pytest.raises(UsageError, match=r"stream.jpg is a named pipe \(FIFO\), not an image file; remove it"):
            image_paths([given])


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: (p / "empty").mkdir(), ["no images in", "empty", ".png"]),
        (lambda p: p / "nowhere", ["nowhere: no such file or folder"]),
    ],
    ids=["empty-folder", "missing"],
)
def test_nothing_to_classify_is_one_line(tmp_path, make, words):
    given = make(tmp_path) or tmp_path / "empty"
    with pytest.raises(UsageError) as caught:
        image_paths([given])
    assert "\n" not in str(caught.value) and all(w in str(caught.value) for w in words), caught.value


def test_the_top_k_are_the_likeliest_first_ties_to_the_lower_label():
    assert top(np.array([0.2, 0.5, 0.2, 0.1]), list("abcd"), 3) == [("b", 0.5), ("a", 0.2), ("c", 0.2)]
    assert top(np.array([0.7, 0.3]), ["x", "y"], 5) == [("x", 0.7), ("y", 0.3)]  # k beyond the classes: all of them


def test_images_are_classified_in_batches_and_a_bad_one_is_named_and_skipped(tmp_path):
    paths = [str(write_image(tmp_path / f"{i:03d}.png")) for i in range(BATCH + 2)]
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    paths.insert(3, str(tmp_path / "bad.png"))
    model, lines, done = ByMeanColour(), [], []

    predictions = classify(model, paths, 2, lines.append, done.append)

    assert [p.file for p in predictions] == [p for p in paths if not p.endswith("bad.png")]
    assert model.batches == [BATCH - 1, 3] and done == [BATCH, 3]
    assert lines == [f"cannot decode {tmp_path / 'bad.png'}: {lines[0].split(': ', 1)[1]}"]
    assert lines[0].endswith("; skipped") and "\n" not in lines[0]
    first = predictions[0]
    assert len(first.top) == 2 and first.top[0][1] >= first.top[1][1]
    assert first.record() == {"file": first.file, "top": [{"class": c, "probability": p} for c, p in first.top]}


def test_nothing_decoded_is_one_line_after_each_file_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    lines: list[str] = []
    with pytest.raises(UsageError) as caught:
        classify(ByMeanColour(), [str(tmp_path / "notes.txt")], 5, lines.append)
    assert len(lines) == 1 and "notes.txt" in lines[0]
    assert str(caught.value).startswith("no images to classify: the one file given cannot be decoded")
