import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import write_image, write_png_header
from trainer import data, layout
from trainer.errors import UsageError


def test_index_folder_reads_every_awkward_but_valid_image(image_tree):
    train, val = data.index_folder(image_tree)
    assert train.classes == ["cat", "chat noir é"]
    assert len(train.samples) == 6  # the hidden .DS_Store is ignored; the nested image is found
    assert val.classes == train.classes and len(val.samples) == 2
    for path, _ in train.samples + val.samples:
        image = data.load_rgb(path)
        assert image.mode == "RGB"


def test_val_labels_follow_train_class_order(tmp_path):
    for name in ("a", "b", "c"):
        write_image(tmp_path / "train" / name / "x.png")
    write_image(tmp_path / "val" / "c" / "y.png")
    _, val = data.index_folder(tmp_path)
    assert val.samples[0][1] == 2


@pytest.mark.parametrize("layout, message", [
    ({}, "does not exist"),
    ({"train/": None}, "no train/<class>/ folders"),
    ({"train/a/x.png": "img", "train/b/": None}, "class folder .*train/b has no images"),
    ({"train/a/x.png": "img", "train/a/notes.txt": "text"}, "notes.txt is not an image file"),
    ({"train/a/x.png": "img", "train/b/y.png": "img", "val/zebra/y.png": "img"}, "class folders that train/ lacks: zebra"),
    ({"train/a/x.png": "img", "train/b/y.png": "img", "val/": None}, "val has no class folders"),
    ({"train/a/x.png": "img", "train/b/y.png": "img", "val": "text"}, "val has no class folders"),
    ({"train": "text"}, "no train/<class>/ folders"),
])
def test_bad_layouts_name_the_problem(tmp_path, layout, message):
    root = tmp_path / "data"
    for rel, kind in layout.items():
        target = root / rel
        if kind is None:
            target.mkdir(parents=True)
        elif kind == "img":
            write_image(target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("hello")
    with pytest.raises(UsageError, match=message):
        data.index_folder(root)


def test_a_corrupt_image_is_named(tmp_path):
    bad = tmp_path / "train" / "a" / "broken.jpg"
    write_image(bad, fmt="JPEG")
    write_image(tmp_path / "train" / "b" / "fine.png")
    bad.write_bytes(bad.read_bytes()[:40])
    train, _ = data.index_folder(tmp_path)
    with pytest.raises(UsageError, match="broken.jpg"):
        data.verify_images(train.samples)


def test_verify_images_splits_the_work_between_workers(image_tree):
    train, _ = data.index_folder(image_tree)
    counts = [data.verify_images(train.samples, rank, 4) for rank in range(4)]
    assert sum(counts) == len(train.samples)


def test_resumable_sampler_skips_what_was_trained_and_keeps_the_order():
    full = data.ResumableSampler(range(20), num_replicas=2, rank=1, shuffle=True, seed=3)
    full.set_epoch(5)
    resumed = data.ResumableSampler(range(20), num_replicas=2, rank=1, shuffle=True, seed=3)
    resumed.set_epoch(5)
    resumed.skip = 4
    assert list(resumed) == list(full)[4:]
    assert len(resumed) == 6


def test_shard_sampler_sees_every_sample_once_without_padding():
    shards = [list(data.ShardSampler(11, rank, 3)) for rank in range(3)]
    assert sorted(i for shard in shards for i in shard) == list(range(11))


def test_synthetic_batches_repeat_one_fixed_batch():
    batches = data.SyntheticBatches(batch_size=4, image_size=8, num_classes=10, steps=3, seed=0)
    seen = list(batches)
    assert len(seen) == 3 and seen[0][0].shape == (4, 3, 8, 8)
    assert torch.equal(seen[0][0], seen[2][0])


def test_transforms_give_the_requested_size(image_tree):
    image = Image.new("RGB", (50, 30))
    assert data.train_transform(16, 0.5, hflip=True)(image).shape == (3, 16, 16)
    assert data.val_transform(16)(image).shape == (3, 16, 16)


def test_sixteen_bit_images_keep_their_contrast(tmp_path):
    path = tmp_path / "deep.png"
    Image.fromarray(np.array([[0, 1000], [30000, 65535]], dtype=np.uint16)).save(path)
    pixels = np.asarray(data.load_rgb(str(path)))[:, :, 0]
    assert pixels.tolist() == [[0, 3], [116, 255]]


def test_batch_must_fit_the_data():
    data.check_batch_fits(4, 2, 8)
    with pytest.raises(UsageError, match="--batch-size 5 x 2 workers is more than the 8 training images"):
        data.check_batch_fits(5, 2, 8)


@pytest.mark.parametrize("width, height", [(20000, 20000), (10000, 10000), (200000, 500)])  # past PIL's error; its warning
@pytest.mark.parametrize("decode", [data.load_rgb, layout.check_image, layout.check_header])
def test_a_decompression_bomb_is_refused_by_name_and_limit(tmp_path, width, height, decode):
    bomb = write_png_header(tmp_path / "train" / "a" / "huge one.png", width, height)
    with pytest.raises(UsageError) as refused:
        decode(str(bomb))
    assert str(refused.value) == (f"image {bomb} has {width * height} pixels, more than the {Image.MAX_IMAGE_PIXELS} "
                                  "that decoding allows (a guard against decompression bombs); shrink it or remove the file")


@pytest.mark.parametrize("content", [b"", b"GIF89a", b"\x89PNG\r\n\x1a\n" + b"\0" * 40, b"BM" + b"\xff" * 60])
@pytest.mark.parametrize("decode", [data.load_rgb, layout.check_image, layout.check_header])
def test_every_decoding_failure_names_the_file(tmp_path, content, decode):
    bad = tmp_path / "odd.gif"
    bad.write_bytes(content)
    with pytest.raises(UsageError, match=f"image {re.escape(str(bad))} \\(.+\\); replace or remove the file"):
        decode(str(bad))


def link(path, target):
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


@pytest.mark.parametrize("name, target, message", [
    ("train/a/self.png", "self.png", "train/a/self.png is a symlink loop \\(it points to self.png"),
    ("train/a/up", "..", "train/a/up is a symlink loop \\(it points to \\.\\., a folder that holds it\\)"),
    ("train/a/deep/er/root", "{root}", "train/a/deep/er/root is a symlink loop"),
    ("train/c", "d", "train/c is a symlink loop"),  # with train/d -> c below
    ("train/a/gone.png", "missing.png", "train/a/gone.png is a broken symlink \\(its target missing.png does not exist"),
    ("train/e", "/nowhere/at/all", "train/e is a broken symlink"),
    ("val/a/gone", "../../nothing", "val/a/gone is a broken symlink"),
])
def test_symlink_loops_and_broken_links_are_named(tmp_path, name, target, message):
    root = tmp_path / "data"
    for rel in ("train/a/x.png", "train/b/y.png", "val/a/z.png"):
        write_image(root / rel)
    link(root / name, target.format(root=root))
    if name == "train/c":
        link(root / "train" / "d", "c")
    with pytest.raises(UsageError, match=message):
        data.index_folder(root)


def test_links_that_lead_elsewhere_are_followed(tmp_path):
    root = tmp_path / "data"
    write_image(root / "train" / "a" / "x.png")
    write_image(tmp_path / "elsewhere" / "b" / "y.png")
    link(root / "train" / "b", tmp_path / "elsewhere" / "b")
    link(root / "train" / "a" / "sibling", "../b")  # b's images again, under a: not a loop
    link(root / "train" / "a" / "same.png", "x.png")
    train, _ = data.index_folder(root)
    assert train.classes == ["a", "b"] and len(train.samples) == 4


@pytest.mark.parametrize("name", ["new\nline.png", "tab\tbed.png", "carriage\rreturn.png", "bell\a.png", "del\x7f.png",
                                  "next\x85line.png", "line\u2028sep.png", "escape\x1b[31m.png"])
@pytest.mark.parametrize("where", ["train/a/{}", "train/a/nested/{}", "train/{}/x.png", "val/a/{}"])
def test_names_with_control_characters_are_refused_on_one_line(tmp_path, name, where):
    root = tmp_path / "data"
    for rel in ("train/a/x.png", "train/b/y.png", "val/a/z.png"):
        write_image(root / rel)
    bad = where.format(name)
    write_image(root / (bad if bad.endswith(".png") else bad + ".png"))
    with pytest.raises(UsageError) as refused:
        data.index_folder(root)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and "has a control character" in message and "rename it" in message
    assert repr(name)[1:-1] in message


def test_a_name_that_is_not_utf8_is_refused(tmp_path):
    root = tmp_path / "data"
    write_image(root / "train" / "b" / "y.png")
    write_image(Path(os.fsdecode(bytes(root / "train" / "a") + b"/caf\xe9.png")))
    with pytest.raises(UsageError, match=r"b'.*/train/a/caf\\xe9.png' is not a valid UTF-8 name; rename it"):
        data.index_folder(root)


@pytest.mark.parametrize("folders", [["only"], ["only", "only/nested"]])
def test_one_class_is_refused(tmp_path, folders):
    for folder in folders:
        write_image(tmp_path / "train" / folder / "x.png")
    write_image(tmp_path / "val" / "only" / "y.png")
    with pytest.raises(UsageError, match=f"^data folder {tmp_path} has 1 class \\(only\\) under train/; a classifier "
                                         "needs at least 2: add another train/<class>/ folder of images$"):
        data.index_folder(tmp_path)


@pytest.mark.parametrize("make", [lambda p: write_image(p), lambda p: p.write_text("x"), lambda p: link(p, "/dev/null")])
def test_a_file_given_as_the_data_folder_is_called_a_file(tmp_path, make):
    given = tmp_path / "data.png"
    make(given)
    with pytest.raises(UsageError, match=f"^data folder {given} is a file, not a folder; point --data at a folder"):
        data.index_folder(given)
