import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import write_image
from trainer import data
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
    ({"train/a/x.png": "img", "val/zebra/y.png": "img"}, "class folders that train/ lacks: zebra"),
    ({"train/a/x.png": "img", "val/": None}, "val has no class folders"),
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
