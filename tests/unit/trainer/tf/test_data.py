"""The TensorFlow trainers' input pipeline reads the folders the PyTorch trainer reads, as it reads them: the same
index, the same errors for awkward or corrupt files, DistributedSampler's shards and batch counts, torchvision's
geometry; a resumed epoch sees exactly the batches of the uninterrupted one."""

import argparse
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import torch
from PIL import Image
from torch.utils.data.distributed import DistributedSampler

from nodelib import image_files, layout
from nodelib.errors import UsageError
from tests.fakes.image_files import write_image
from tests.unit.trainer.test_bad_files import corrupt_files, two_classes
from trainer import badfiles
from trainer import data as torch_data
from trainer.tf import data


def options(folder, out: Path, **changed) -> argparse.Namespace:
    """The options the pipeline reads, as the trainers' parsers give them."""
    values = dict(
        data=str(folder),
        out=out,
        batch_size=2,
        image_size=16,
        min_crop_scale=0.08,
        hflip=True,
        seed=0,
        loader_workers=2,
        steps_per_epoch=0,
        num_classes=10,
        bad_files="fail",
        verify_images=False,
    )
    return argparse.Namespace(**{**values, **changed})


def as_arrays(dataset) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(images.numpy(), labels.numpy()) for images, labels in data.batches(dataset)]


def test_the_awkward_tree_trains_and_validates_in_batches_of_the_options(image_tree, tmp_path):
    args = options(image_tree, tmp_path / "out", batch_size=4)
    images = data.load(args, args.out, 0, 1)
    train, val = torch_data.index_folder(image_tree)
    assert images.train == train and images.val == val and images.classes == ["cat", "chat noir é"]
    assert images.facts == {"train_images": 6, "val_images": 2}
    assert data.steps_per_epoch(images, args, 1) == 1  # 6 images: one full batch of 4, the rest dropped
    [(batch, labels)] = as_arrays(data.train_dataset(images, args, 0, 1, epoch=0))
    assert batch.shape == (4, 16, 16, 3) and batch.dtype == np.float32 and labels.dtype == np.int32
    lowest, highest = (0 - np.array(data.MEAN)) / data.STD, (1 - np.array(data.MEAN)) / data.STD
    assert np.all(batch >= lowest.min() - 1e-5) and np.all(batch <= highest.max() + 1e-5) and batch.std() > 0.3
    [(batch, labels)] = as_arrays(data.val_dataset(images, args, 0, 1))  # the last, partial batch kept
    assert batch.shape == (2, 16, 16, 3) and labels.tolist() == [0, 1]


def test_every_format_and_mode_decodes_to_the_pil_loaders_pixels(image_tree):
    cat = image_tree / "train" / "cat"
    write_image(cat / "tiff.tif", "RGB", fmt="TIFF")  # PIL's to decode, as BMPs and anything TensorFlow does not read
    write_image(cat / "tiff named.png", "RGB", fmt="TIFF")  # the content decides, not the name
    write_image(cat / "jpeg named.png", "RGB", fmt="JPEG")
    write_image(cat / "anim.gif", "RGB", fmt="GIF")
    write_image(cat / "gray.jpg", "L", fmt="JPEG")
    Image.fromarray(np.eye(9, dtype=np.uint8) * 255).convert("1").save(cat / "one bit.bmp")  # TensorFlow refuses it
    train, val = layout.index_folder(image_tree)
    for path, _ in train.samples + val.samples:
        pixels = data.decode_whole(tf.constant(path)).numpy()
        expected = np.asarray(image_files.load_rgb(path))  # what the PyTorch trainer decodes
        assert pixels.shape == expected.shape and np.abs(pixels.astype(int) - expected).max() <= 8, path


def test_an_image_only_pil_decodes_is_named_with_tensorflows_reason(tmp_path):
    path = tmp_path / "one bit.bmp"
    Image.fromarray(np.eye(9, dtype=np.uint8) * 255).convert("1").save(path)
    with pytest.raises(tf.errors.InvalidArgumentError) as failed:  # what in_order raises for an image left out
        data.in_order((tf.constant(1, tf.int64), tf.zeros([1]), 0), (tf.constant(0, tf.int64), tf.constant(str(path))))
    assert str(data.unreadable_image(failed.value)) == (
        f"cannot decode image {path} (TensorFlow: Number of channels inherent in the image must be 1, 3 or 4, was 0); "
        "replace or remove the file"
    )
    assert data.unreadable_image(tf.errors.InvalidArgumentError(None, None, "another error")) is None


@pytest.mark.parametrize("width, height", [(50, 30), (31, 47)])
def test_validation_resizes_and_crops_as_torchvisions_transform(tmp_path, width, height):
    path = tmp_path / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)).resize(
        (width // 4, height // 4)
    ).resize((width, height), Image.Resampling.BILINEAR).save(path)  # smooth: resampling filters agree on it
    image = data.decode_whole(tf.constant(str(path)))
    ours = data.normalised(data.centre_crop(data.shorter_side(image, data.val_resize(16)), 16)).numpy()
    theirs = torch_data.val_transform(16, "pil")(Image.open(path)).numpy().transpose(1, 2, 0)
    assert ours.shape == theirs.shape == (16, 16, 3) and np.abs(ours - theirs).mean() < 0.03


def test_a_resumed_epoch_sees_exactly_the_batches_of_the_uninterrupted_one(digits, tmp_path):
    args = options(digits, tmp_path / "out", batch_size=8, steps_per_epoch=4, loader_workers=3)
    images = data.load(args, args.out, 0, 1)
    whole = as_arrays(data.train_dataset(images, args, 1, 2, epoch=3))
    resumed = as_arrays(
        data.train_dataset(images, argparse.Namespace(**vars(args) | {"loader_workers": 1}), 1, 2, 3, 2)
    )
    assert len(whole) == 4 and len(resumed) == 2
    for (a, labels_a), (b, labels_b) in zip(whole[2:], resumed):  # the same images, crops and flips, in order
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(labels_a, labels_b)
    other_epoch = as_arrays(data.train_dataset(images, args, 1, 2, epoch=4))
    assert not np.array_equal(other_epoch[0][0], whole[0][0])


def fake_images(train: int, val: int = 0) -> data.Images:
    """Images of `train` and `val` samples that are never read."""
    split = layout.Split(["a"], [(f"/nowhere/{i}.png", 0) for i in range(train)])
    val_split = layout.Split(["a"], [(f"/nowhere/v{i}.png", 0) for i in range(val)])
    return data.Images(split, val_split, ["a"], {})


@pytest.mark.parametrize("n, world, batch, cap", [(10, 3, 1, 0), (10, 3, 2, 0), (1000, 8, 32, 0), (50, 4, 3, 2)])
def test_the_ranks_share_the_epoch_as_distributed_sampler_does(tmp_path, n, world, batch, cap):
    images, args = fake_images(n), options("/nowhere", tmp_path, batch_size=batch, steps_per_epoch=cap)
    full = len(DistributedSampler(range(n), world, 0)) // batch
    assert data.steps_per_epoch(images, args, world) == (min(full, cap) if cap else full)
    uncapped = options("/nowhere", tmp_path, batch_size=1)
    shards = [data.train_order(images, uncapped, rank, world, epoch=5) for rank in range(world)]
    assert len({len(samples) for samples, _ in shards}) == 1  # every rank as many
    places = np.sort(np.concatenate([p for _, p in shards]))
    np.testing.assert_array_equal(places, np.arange(len(places)))  # disjoint, covering the padded permutation
    dealt = np.concatenate([s for s, _ in shards])[np.argsort(np.concatenate([p for _, p in shards]))]
    order = data.permutation(n, 0, 5)
    np.testing.assert_array_equal(dealt, np.resize(order, len(dealt)))  # padded with its start, as the sampler
    assert sorted(order) == list(range(n)) and not np.array_equal(order, data.permutation(n, 0, 6))


def test_validation_shards_hold_every_image_once_even_where_a_rank_gets_none(image_tree, tmp_path):
    assert sorted(np.concatenate([data.val_order(fake_images(1, 11), r, 3) for r in range(3)])) == list(range(11))
    args = options(image_tree, tmp_path / "out", batch_size=1)
    images = data.load(args, args.out, 0, 3)
    seen = [as_arrays(data.val_dataset(images, args, rank, 3)) for rank in range(3)]
    assert [[labels.tolist() for _, labels in batches] for batches in seen] == [[[0]], [[1]], []]


def test_synthetic_data_is_one_fixed_batch_per_rank_repeated(tmp_path):
    args = options(layout.SYNTHETIC, tmp_path, batch_size=3, steps_per_epoch=4, num_classes=5)
    images = data.load(args, tmp_path, 1, 2)
    assert images.classes == ["0", "1", "2", "3", "4"] and images.facts == {} and images.val is None
    assert data.steps_per_epoch(images, args, 2) == 4 and data.val_dataset(images, args, 1, 2) is None
    batches = as_arrays(data.train_dataset(images, args, 1, 2, epoch=0, skip_steps=1))
    assert len(batches) == 3 and batches[0][0].shape == (3, 16, 16, 3) and set(batches[0][1]) <= set(range(5))
    np.testing.assert_array_equal(batches[0][0], batches[2][0])
    other_rank = as_arrays(data.train_dataset(images, args, 0, 2, epoch=0))[0][0]
    assert not np.array_equal(other_rank, batches[0][0])
    assert data.steps_per_epoch(images, options(layout.SYNTHETIC, tmp_path), 2) == 100


def test_crops_are_random_resized_crops_and_fall_back_to_torchvisions_centre():
    boxes = [data.crop_box(300, 400, tf.constant([7, i], tf.int64), (0.08, 1.0)).numpy() for i in range(100)]
    for top, left, h, w in boxes:
        assert 0 <= top <= 300 - h and 0 <= left <= 400 - w
        assert 0.08 * 0.99 <= h * w / (300 * 400) <= 1 and 3 / 4 * 0.98 <= w / h <= 4 / 3 * 1.02
    assert len({tuple(box) for box in boxes}) == 100
    for height, width in [(1, 100), (100, 1), (3, 2)]:  # no try fits: torchvision's centre crop
        ours = data.crop_box(height, width, tf.constant([0, 0], tf.int64), (0.99, 1.0)).numpy().tolist()
        torch.manual_seed(0)
        assert ours == list(torch_data.crop_box(width, height, (0.99, 1.0))), (height, width)


def test_bad_images_are_refused_or_left_out_as_the_pytorch_trainer_does(tmp_path):
    """The PyTorch trainer (train.py) takes its splits from badfiles.usable_splits too: the same refusal, the same
    images left out, the same facts in metrics.json."""
    root = two_classes(tmp_path / "data")
    for policy in ("fail", "skip"):
        args = options(root, tmp_path / policy, verify_images=True, bad_files=policy)
        if policy == "fail":
            with pytest.raises(UsageError) as ours:
                data.load(args, args.out, 0, 1)
            with pytest.raises(UsageError) as theirs:
                badfiles.usable_splits(args, args.out, layout.index_folder(root))
            assert str(ours.value) == str(theirs.value) and "2 of 10 images" in str(ours.value)
            continue
        images = data.load(args, args.out, 0, 1)
        splits = badfiles.usable_splits(args, args.out, layout.index_folder(root))
        assert (images.train, images.val) == splits[:2] and len(images.train.samples) == 6
        assert images.facts == badfiles.data_facts(args, args.out, *splits[:3])
        assert images.facts["bad_files"]["count"] == 2 and (args.out / "bad-files.tsv").exists()


def test_the_workers_take_the_preflights_decode(tmp_path):
    root, out = two_classes(tmp_path / "data"), tmp_path / "out"
    args = options(root, out, verify_images=True, bad_files="skip")
    _, _, record, source = badfiles.usable_splits(args, out, layout.index_folder(root))  # as core.check_only
    assert source == badfiles.DECODED
    badfiles.hand_to_workers(out, record)
    worker = data.load(options(root, out, bad_files="skip"), out, 1, 2, gather=lambda mine: [mine, mine])
    assert (out / "images-checked.json").exists() and worker.facts["bad_files"]["count"] == 2
    assert len(worker.train.samples) == 6  # nothing decoded again: the preflight's list, the same images left out


def test_a_layout_error_is_the_pytorch_trainers(tmp_path):
    write_image(tmp_path / "train" / "a" / "x.png")
    (tmp_path / "train" / "a" / "notes.txt").write_text("hello")
    with pytest.raises(UsageError) as ours:
        data.load(options(tmp_path, tmp_path / "out"), tmp_path / "out", 0, 1)
    with pytest.raises(UsageError) as theirs:
        torch_data.index_folder(tmp_path)
    assert str(ours.value) == str(theirs.value) and "notes.txt is not an image file" in str(ours.value)


@pytest.mark.parametrize(
    "name, split", [("truncated.jpg", "train"), ("bomb.png", "train"), ("removed.png", "train"), ("garbage.png", "val")]
)
def test_an_image_that_fails_while_training_is_named_as_the_pytorch_loader_names_it(tmp_path, name, split):
    root = tmp_path / "data"
    for label in "ab":
        for i in range(3):
            write_image(root / split / label / f"ok{i}.png")
        write_image(root / "train" / label / "more.png")
    corrupt_files(tmp_path / "corrupt")
    bad = root / split / "a" / name
    if name == "removed.png":
        write_image(bad)
    else:
        shutil.move(tmp_path / "corrupt" / name, bad)
    args = options(root, tmp_path / "out", hflip=False)
    images = data.load(args, args.out, 0, 1)  # nothing decoded yet: --no-verify-images, no .verified.json
    if name == "removed.png":
        bad.unlink()
    index = [path for path, _ in (images.train if split == "train" else images.val).samples].index(str(bad))
    torch_set = torch_data.image_files(
        (images.train if split == "train" else images.val),
        torch_data.train_transform(16, 0.08, False, "fast") if split == "train" else torch_data.val_transform(16),
        "fast" if split == "train" else "pil",
    )
    with pytest.raises(UsageError) as theirs:
        torch_set[index]
    dataset = data.train_dataset(images, args, 0, 1, 0) if split == "train" else data.val_dataset(images, args, 0, 1)
    with pytest.raises(UsageError) as ours:
        as_arrays(dataset)
    assert str(ours.value) == str(theirs.value) and str(bad) in str(ours.value)


def test_loader_workers_auto_or_0_leave_the_decoding_threads_to_tf_data():
    assert data.parallel_calls("auto") == data.parallel_calls(0) == tf.data.AUTOTUNE
    assert data.parallel_calls(3) == 3
