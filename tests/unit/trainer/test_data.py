import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import default_collate

from nodelib import image_files, layout
from nodelib.errors import UsageError
from tests.fakes.image_files import write_image, write_png_header
from trainer import data


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


@pytest.mark.parametrize(
    "layout, message",
    [
        ({}, "does not exist"),
        ({"train/": None}, "no train/<class>/ folders"),
        ({"train/a/x.png": "img", "train/b/": None}, "class folder .*train/b has no images"),
        ({"train/a/x.png": "img", "train/a/notes.txt": "text"}, "notes.txt is not an image file"),
        (
            {"train/a/x.png": "img", "train/b/y.png": "img", "val/zebra/y.png": "img"},
            "class folder that train/ lacks: zebra",
        ),
        ({"train/a/x.png": "img", "train/b/y.png": "img", "val/": None}, "val has no class folders"),
        ({"train/a/x.png": "img", "train/b/y.png": "img", "val": "text"}, "val has no class folders"),
        ({"train": "text"}, "no train/<class>/ folders"),
    ],
)
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


def test_a_synthetic_batch_is_kept_in_the_models_memory_format_so_a_step_copies_nothing():
    plain = data.SyntheticBatches(batch_size=4, image_size=8, num_classes=10, steps=1, seed=0)
    kept = data.SyntheticBatches(
        batch_size=4, image_size=8, num_classes=10, steps=1, seed=0, device=torch.device("cpu"), channels_last=True
    )
    images = next(iter(kept))[0]
    assert images.is_contiguous(memory_format=torch.channels_last) and torch.equal(images, plain.images)
    # what the trainer's to_device does each step returns this very tensor: no copy, no layout change
    assert images.to(torch.device("cpu"), non_blocking=True, memory_format=torch.channels_last) is images


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


@pytest.mark.parametrize(
    "width, height", [(20000, 20000), (10000, 10000), (200000, 500)]
)  # past PIL's error; its warning
@pytest.mark.parametrize("decode", [data.load_rgb, image_files.check_image, image_files.check_header])
def test_a_decompression_bomb_is_refused_by_name_and_limit(tmp_path, width, height, decode):
    bomb = write_png_header(tmp_path / "train" / "a" / "huge one.png", width, height)
    with pytest.raises(UsageError) as refused:
        decode(str(bomb))
    assert str(refused.value) == (
        f"image {bomb} has {width * height} pixels, more than the {Image.MAX_IMAGE_PIXELS} "
        "that decoding allows (a guard against decompression bombs); shrink it or remove the file"
    )


@pytest.mark.parametrize("content", [b"", b"GIF89a", b"\x89PNG\r\n\x1a\n" + b"\0" * 40, b"BM" + b"\xff" * 60])
@pytest.mark.parametrize("decode", [data.load_rgb, image_files.check_image, image_files.check_header])
def test_every_decoding_failure_names_the_file(tmp_path, content, decode):
    bad = tmp_path / "odd.gif"
    bad.write_bytes(content)
    with pytest.raises(UsageError, match=f"image {re.escape(str(bad))} \\(.+\\); replace or remove the file"):
        decode(str(bad))


def link(path, target):
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


@pytest.mark.parametrize(
    "name, target, message",
    [
        ("train/a/self.png", "self.png", "train/a/self.png is a symlink loop \\(it points to self.png"),
        ("train/a/up", "..", "train/a/up is a symlink loop \\(it points to \\.\\., a folder that holds it\\)"),
        ("train/a/deep/er/root", "{root}", "train/a/deep/er/root is a symlink loop"),
        ("train/c", "d", "train/c is a symlink loop"),  # with train/d -> c below
        (
            "train/a/gone.png",
            "missing.png",
            "train/a/gone.png is a broken symlink \\(its target missing.png does not exist",
        ),
        ("train/e", "/nowhere/at/all", "train/e is a broken symlink"),
        ("val/a/gone", "../../nothing", "val/a/gone is a broken symlink"),
    ],
)
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


@pytest.mark.parametrize(
    "name",
    [
        "new\nline.png",
        "tab\tbed.png",
        "carriage\rreturn.png",
        "bell\a.png",
        "del\x7f.png",
        "next\x85line.png",
        "line\u2028sep.png",
        "escape\x1b[31m.png",
    ],
)
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
    with pytest.raises(
        UsageError,
        match=f"^data folder {tmp_path} has 1 class \\(only\\) under train/; a classifier "
        "needs at least 2: add another train/<class>/ folder of images$",
    ):
        data.index_folder(tmp_path)


@pytest.mark.parametrize(
    "make", [lambda p: write_image(p), lambda p: p.write_text("x"), lambda p: link(p, "/dev/null")]
)
def test_a_file_given_as_the_data_folder_is_called_a_file(tmp_path, make):
    given = tmp_path / "data.png"
    make(given)
    with pytest.raises(UsageError, match=f"^data folder {given} is a file, not a folder; point --data at a folder"):
        data.index_folder(given)


# The fast loader (--loader fast): uint8 tensors cropped where they are, normalised on the device.


def test_the_fast_loader_decodes_every_awkward_image_as_pil_does(image_tree):
    """JPEGs go to libjpeg-turbo directly, the rest through PIL: the same RGB pixels either way."""
    train, val = data.index_folder(image_tree)
    for path, _ in train.samples + val.samples:
        fast = data.read_uint8(path)
        pil = torch.from_numpy(np.asarray(data.load_rgb(path)).copy()).permute(2, 0, 1)
        assert fast.dtype == torch.uint8 and fast.shape == pil.shape
        assert (fast.int() - pil.int()).abs().float().mean() < 2, path  # JPEG decoders may round a pixel apart


@pytest.mark.parametrize("content", [b"", b"\xff\xd8\xff\xe0" + b"\0" * 40, b"\x89PNG\r\n\x1a\n" + b"\0" * 40])
def test_the_fast_loader_names_a_file_it_cannot_decode(tmp_path, content):
    bad = tmp_path / "odd.jpg"
    bad.write_bytes(content)
    with pytest.raises(UsageError, match=f"image {re.escape(str(bad))} \\(.+\\); replace or remove the file"):
        data.read_uint8(str(bad))


def test_the_fast_loader_names_a_jpeg_cut_short_as_pil_does(tmp_path):
    """libjpeg-turbo would fill the missing rows with grey: torchvision refuses it, and PIL names the file."""
    cut = write_image(tmp_path / "cut.jpg", fmt="JPEG", size=64)
    cut.write_bytes(cut.read_bytes()[:400])
    with pytest.raises(UsageError, match=f"cannot decode image {re.escape(str(cut))} \\(.+\\); replace or remove"):
        data.read_uint8(str(cut))


def test_the_fast_loader_refuses_a_decompression_bomb_before_decoding(tmp_path):
    bomb = write_png_header(tmp_path / "huge.png", 20000, 20000)
    with pytest.raises(UsageError, match="400000000 pixels, more than the"):
        data.read_uint8(str(bomb))


def test_normalising_on_the_device_gives_what_the_pil_loader_makes():
    pixels = np.random.default_rng(0).integers(0, 256, (24, 20, 3), dtype=np.uint8)
    pil = data.to_floats("pil")
    expected = pil[1](pil[0](Image.fromarray(pixels)))
    batch = torch.from_numpy(pixels).permute(2, 0, 1)[None].contiguous(memory_format=torch.channels_last)
    assert torch.allclose(data.normalise(batch)[0], expected, atol=1e-5)
    assert data.normalise(expected) is expected  # float batches (the PIL loader's, synthetic) pass unchanged


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_a_channels_last_batch_is_normalised_in_one_pass_to_torch_s_floats(layout):
    """The fast loader's CPU batches (channels-last uint8) go through jpeg_crop's C loop: torch's floats (three
    passes) bit for bit, in the layout asked for; any other layout goes through torch."""
    pixels = torch.from_numpy(np.random.default_rng(2).integers(0, 256, (4, 9, 7, 3), dtype=np.uint8))
    batch = pixels.permute(0, 3, 1, 2)  # channels-last memory, as stack_channels_last makes it
    assert data.in_one_pass(batch, layout) and not data.in_one_pass(batch.contiguous(), layout)
    ours, torch_s = data.normalise(batch, layout), data.normalise(batch.contiguous(), layout)
    assert ours.dtype == torch.float32 and torch.equal(ours, torch_s) and ours.is_contiguous(memory_format=layout)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (data.MEAN, data.STD))
    assert torch.equal(ours, batch.float().mul_(1 / (255 * std)).add_(-mean / std))  # the formula in float32, exactly
    floats = torch_s.contiguous()
    assert data.normalise(floats, layout).is_contiguous(memory_format=layout)  # float batches only laid out


def test_the_fast_loader_stacks_its_batches_in_the_channels_last_memory_it_decodes_in(image_tree):
    """Stacking HWC crops is a copy, not a transpose: the batch is (N, 3, H, W) over (N, H, W, 3) memory, the
    values default_collate makes, with one worker as without."""
    crops = [torch.randint(0, 256, (5, 6, 3), dtype=torch.uint8).permute(2, 0, 1) for _ in range(2)]
    samples = [(image, i) for i, image in enumerate([*crops, torch.zeros(3, 5, 6, dtype=torch.uint8)])]  # one CHW
    images, targets = data.stack_channels_last(samples)
    expected, expected_targets = default_collate(samples)
    assert torch.equal(images, expected) and torch.equal(targets, expected_targets)
    assert images.permute(0, 2, 3, 1).is_contiguous()
    train, _ = data.index_folder(image_tree)
    dataset = data.image_files(train, data.train_transform(16, 0.5, True, "fast"), "fast")
    for workers in (0, 1):
        loader = data.make_loader(dataset, 2, data.ShardSampler(len(dataset), 0, 1), workers, False, True)
        batch = next(iter(loader))[0]
        assert batch.shape == (2, 3, 16, 16) and batch.permute(0, 2, 3, 1).is_contiguous(), workers


def test_the_fast_loader_crops_and_flips_uint8_tensors_and_evaluates_deterministically(tmp_path):
    path = tmp_path / "photo.jpg"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (30, 50, 3), dtype=np.uint8)).save(path)
    image = data.read_uint8(str(path))
    crop = data.train_transform(16, 0.5, True, "fast")(image)
    assert crop.shape == (3, 16, 16) and crop.dtype == torch.uint8
    evaluate = data.val_transform(16, "fast")
    assert torch.equal(evaluate(image), evaluate(image)) and evaluate(image).shape == (3, 16, 16)
    pil = data.val_transform(16, "pil")(data.load_rgb(str(path)))
    assert (data.normalise(evaluate(image)[None])[0] - pil).abs().mean() < 0.1  # the same view, resized by another hand


def test_both_loaders_draw_the_same_crops_and_flips(tmp_path):
    """The fast loader's crop (torchvision v2) draws the random numbers the PIL loader's (v1) draws: with one seed,
    both take the same part of the image and flip it alike."""
    ramp = np.tile(np.linspace(0, 255, 60, dtype=np.uint8), (40, 1))
    image = Image.fromarray(np.stack([ramp] * 3, axis=-1))
    crops = []
    for loader in ("pil", "fast"):
        torch.manual_seed(3)
        transform = data.train_transform(20, 0.2, True, loader)
        source = image if loader == "pil" else torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)
        crops.append(data.normalise(torch.stack([transform(source) for _ in range(8)])))
    assert (crops[0] - crops[1]).abs().mean() < 0.05


# --loader dali, in DALI's CPU-only mode (no GPU here).


def test_dali_batches_follow_the_resumable_sampler_of_each_rank(tmp_path):
    """DALI decodes the files in the order of the trainer's own sampler: the shard of each rank, shuffled by epoch,
    and a resumed epoch starts where the checkpoint left it, as with the other loaders."""
    for i in range(12):
        write_solid(tmp_path / "train" / f"c{i % 2}" / f"{i:02d}.jpg", 20 * i)
    train, _ = data.index_folder(tmp_path)
    shade = {n: 20 * int(Path(path).stem) for n, (path, _) in enumerate(train.samples)}
    dataset = data.image_files(train, data.val_transform(8, "dali"), "dali")
    for rank in (0, 1):
        sampler = data.ResumableSampler(dataset, 2, rank, shuffle=True, seed=0)
        sampler.set_epoch(3)
        sampler.skip = 2  # one batch of this shard trained before the checkpoint
        batches = data.make_loader(dataset, 2, sampler, 1, False, True)
        expected = list(sampler)
        seen = [(images, targets) for images, targets in batches]
        assert len(batches) == len(seen) == 2 and len(expected) == 4
        assert [int(image.float().mean().round()) for images, _ in seen for image in images] == pytest.approx(
            [shade[i] for i in expected], abs=2
        )
        assert [int(t) for _, targets in seen for t in targets] == [train.samples[i][1] for i in expected]


def test_dali_runs_ahead_and_an_epoch_left_early_leaves_nothing_for_the_next(tmp_path):
    """The pipeline prefetches batches ahead of the step (pipelined, asynchronous): an epoch the trainer leaves after
    its first batch (--steps-per-epoch) is drained, so the next epoch's batches are its own, in its order."""
    for i in range(12):
        write_solid(tmp_path / "train" / f"c{i % 2}" / f"{i:02d}.jpg", 20 * i)
    train, _ = data.index_folder(tmp_path)
    dataset = data.image_files(train, data.val_transform(8, "dali"), "dali")
    sampler = data.ResumableSampler(dataset, 1, 0, shuffle=True, seed=0)
    batches = data.make_loader(dataset, 3, sampler, 1, False, True)
    for epoch in (1, 2):
        sampler.set_epoch(epoch)
        for _ in batches:
            # left after the first of four batches: the source gave the pipeline more than that one already
            assert len(list(batches.source.batches)) < 3
            break
    sampler.set_epoch(3)
    shade = {n: 20 * int(Path(path).stem) for n, (path, _) in enumerate(train.samples)}
    seen = [int(image.float().mean().round()) for images, _ in batches for image in images]
    assert seen == pytest.approx([shade[i] for i in sampler], abs=2) and len(seen) == 12
    images, targets = batches.decode([5, 0])  # one batch on its own (what `trainflow bench loader` times)
    assert [int(i.float().mean().round()) for i in images] == pytest.approx([shade[5], shade[0]], abs=2)
    assert targets.tolist() == [train.samples[5][1], train.samples[0][1]]
    assert len([image for images, _ in batches for image in images]) == 12  # and the next epoch is whole


def test_dali_crops_flips_and_evaluates_like_the_other_loaders(tmp_path):
    path = tmp_path / "train" / "a" / "photo.jpg"
    path.parent.mkdir(parents=True)
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (30, 50, 3), dtype=np.uint8)).save(path, quality=95)
    write_solid(tmp_path / "train" / "b" / "plain.png", 100)
    train, _ = data.index_folder(tmp_path)
    crops, _ = next(
        iter(
            data.make_loader(
                data.image_files(train, data.train_transform(16, 0.5, True, "dali"), "dali"),
                2,
                data.ShardSampler(2, 0, 1),
                1,
                False,
                False,
            )
        )
    )
    assert crops.shape == (2, 3, 16, 16) and crops.dtype == torch.uint8
    evaluate = data.image_files(train, data.val_transform(16, "dali"), "dali")
    once, twice = (
        next(iter(data.make_loader(evaluate, 2, data.ShardSampler(2, 0, 1), 1, False, False)))[0] for _ in range(2)
    )
    assert torch.equal(once, twice)  # deterministic
    pil = data.val_transform(16, "pil")(data.load_rgb(str(path)))
    assert (data.normalise(once[:1])[0] - pil).abs().mean() < 0.15  # the same view, resized by another hand


def write_solid(path: Path, shade: int) -> Path:
    """An image of one grey shade."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (24, 16), (shade,) * 3).save(path)
    return path


@pytest.mark.parametrize("loader", ["pil", "fast"])
def test_every_loader_reads_a_photo_as_stored_whatever_its_exif_orientation(tmp_path, loader):
    pixels = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned 90 degrees clockwise: a phone's portrait photo
    pixels.save(tmp_path / "plain.jpg", quality=95)
    pixels.save(tmp_path / "tagged.jpg", quality=95, exif=exif.tobytes())
    split = data.Split(["a"], [(str(tmp_path / "plain.jpg"), 0), (str(tmp_path / "tagged.jpg"), 0)])
    images = data.image_files(split, data.val_transform(32, loader), loader)
    assert torch.equal(images[0][0], images[1][0])  # the tag is not applied, as staging's shrink does not apply it


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_hidden_folder_of_images_in_a_split_is_refused_as_no_class(tmp_path, split):
    for name in ("a", "b", ".git"):
        write_image(tmp_path / "train" / name / "x.png")
    write_image(tmp_path / "val" / "a" / "y.png")
    (tmp_path / "train" / ".git" / "x.png").rename(tmp_path / "train" / ".git" / "HEAD")  # no images: passes
    assert data.index_folder(tmp_path)[0].classes == ["a", "b"]
    write_image(tmp_path / split / "...dots" / "z.jpg")
    for read in (data.index_folder, lambda folder: list(layout.folder_images(folder))):
        with pytest.raises(UsageError, match=rf"{split}/\.\.\.dots holds 1 image, but its name starts with"):
            read(tmp_path)


def test_the_files_layout_lists_every_visible_file_and_refuses_what_cannot_be_read(tmp_path):
    for rel in ("images/0.png", "masks/0.png", "meta.csv", ".git/HEAD", "images/.DS_Store"):
        (tmp_path / "d" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "d" / rel).write_text("x")
    root = tmp_path / "d"
    assert sorted(p.removeprefix(f"{root}/") for p in layout.folder_files(root)) == [
        "images/0.png",
        "masks/0.png",
        "meta.csv",
    ]
    os.mkfifo(root / "masks" / "stream.png")
    with pytest.raises(UsageError, match=r"stream.png is a named pipe \(FIFO\), not a data file"):
        list(layout.folder_files(root))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds no files"):
        list(layout.folder_files(tmp_path / "empty"))
