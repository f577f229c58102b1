"""The sizes of a few of a data folder's training images (infra/data/image_sizes.py), read from their headers: spread
over the classes, and what is no image (other files, unreadable ones, a named pipe, an empty folder) passed over."""

import os
from pathlib import Path

from infra.data.image_sizes import sample_image_sizes
from tests.fakes.image_files import write_image, write_png_header


def test_the_sizes_come_from_the_headers_spread_over_the_classes(tmp_path):
    for c in range(40):  # class c's images are c+1 px wide: the sample shows which classes it read
        for i in range(3):
            write_png_header(tmp_path / "train" / f"class{c:02d}" / f"{i}.png", c + 1, 500)
    sizes = sample_image_sizes(tmp_path, count=32)
    assert len(sizes) == 32 and len({width for width, _ in sizes}) == 32  # one image of each of 32 classes
    widths = {width for width, _ in sizes}
    assert min(widths) == 1 and max(widths) >= 39 and {height for _, height in sizes} == {500}  # first to last


def test_a_few_classes_give_several_images_each(tmp_path):
    for c in "ab":
        for i in range(20):
            write_png_header(tmp_path / "train" / c / "nested" / f"{i}.png", 640, 480)
    assert sample_image_sizes(tmp_path, count=32) == [(640, 480)] * 32


def test_what_is_no_image_is_passed_over(tmp_path):
    train = tmp_path / "train" / "a"
    write_image(train / "real.jpg", size=48, fmt="JPEG")
    (train / "labels.csv").write_text("a,b\n")
    (train / "fake.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (train / ".hidden.png").write_bytes(b"")
    os.mkfifo(train / "pipe.jpg")  # opened, it would wait for a writer forever
    write_png_header(tmp_path / "train" / ".cache" / "x.png", 9, 9)  # a hidden folder is no class
    assert sample_image_sizes(tmp_path) == [(48, 48)]


def test_an_empty_folder_or_one_without_train_gives_no_sizes(tmp_path):
    assert sample_image_sizes(tmp_path / "nowhere") == []
    (tmp_path / "empty" / "train" / "a").mkdir(parents=True)
    assert sample_image_sizes(tmp_path / "empty") == []
    write_png_header(tmp_path / "flat" / "x.png", 500, 375)  # images, but not in train/<class>/
    assert sample_image_sizes(Path(tmp_path / "flat")) == []
