"""The TensorFlow trainers' input pipeline (tf.data): an ImageNet-layout folder or a fixed synthetic batch, sharded
across the Horovod ranks, as the PyTorch trainer's data.py makes it.

The same as data.py: the folder indexed by layout.index_folder (the same errors for the same awkward folders); the
images that cannot be decoded found, refused or left out by badfiles.py's rules (--bad-files, --verify-images,
DATA/.verified.json, OUT/bad-files.tsv, the same messages); the facts metrics.json records; every worker a full
batch at least (check_batch_fits). Training: each epoch one permutation of the images, the same on every rank,
padded to a multiple of the ranks by repeating its start and dealt rank::world (DistributedSampler's order), the
last partial batch dropped, --steps-per-epoch a cap; a random-resized crop (area within (--min-crop-scale, 1), aspect
ratio within 3/4 to 4/3, 10 tries then the centre crop nearest that range, as torchvision's RandomResizedCrop) resized
to --image-size, flipped half the time with --hflip. Validation: the shorter side resized to size/0.875 then the
centre crop, each rank every world-th image, no padding, the last partial batch kept. Batches: float32 NHWC images
normalised by ImageNet's mean and std, int32 labels. Synthetic data: one random batch repeated, as SyntheticBatches.

What differs: the permutation is numpy's (seeded by --seed and the epoch), not torch's randperm, and the crops and
flips are TensorFlow's stateless random numbers, seeded by --seed, the epoch and the image's place in the epoch's
order: a run resumed mid-epoch (skip_steps) sees exactly the batches the uninterrupted run would, at any number of
loader threads, but not the crops of a PyTorch run of the same seed. Decoding: TensorFlow's for what starts as a
JPEG, PNG or GIF does, whatever its name (a JPEG whose end marker is there decodes only its crop, as the fast loader
does), PIL's (image_files.load_rgb, in a numpy_function) for the rest (BMP, TIFF, WebP...: what the PyTorch trainer
reads, this one reads); the pixels differ from PIL's by a few levels (another JPEG decoder, resizing in float,
antialiased as PIL's). --loader-workers is the number of images
decoded in parallel (threads of the tf.data runtime, not processes); auto or 0 lets tf.data choose (AUTOTUNE).

An image that fails to decode while training (nothing checked it) is left out by the pipeline, which then stops with
an error that names it (`in_order`): `batches(dataset)` turns that error into the UsageError the PyTorch trainer
raises for the same file (`unreadable_image`, for a loop that calls Keras fit).
"""

import base64
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from nodelib import image_files, layout
from nodelib.layout import SYNTHETIC, Split
from trainer import badfiles
from trainer.options import check_batch_fits
from trainer.recipe import MEAN, RATIO, STD, SYNTHETIC_STEPS, val_resize

log = logging.getLogger("trainer")

TRIES = 10  # RandomResizedCrop's draws before it falls back to the centre crop
UNREADABLE = "trainflow: cannot decode image"  # in_order's error: then <the file's name in base64> and the name
JPEG_START, JPEG_END = b"\xff\xd8", b"\xff\xd9"  # the first bytes of the formats TensorFlow decodes, and JPEG's last
PNG, GIF = b"\x89PNG", b"GIF"


@dataclass(frozen=True)
class Images:
    """The data of a run, as `load` finds it: the splits, the class names and what metrics.json records about them."""

    train: Split  # the training images (synthetic data: none, and the classes 0 to --num-classes - 1)
    val: Split | None  # the validation images; None without a val/ folder, and for synthetic data
    classes: list[str]  # the class names, label by label (train's folders)
    facts: dict  # metrics.json's data_facts: train_images, val_images, bad_files when some were left out


def load(args, out: Path, rank: int, world: int, gather: badfiles.Gather | None = None) -> Images:
    """Index --data, find the images that cannot be decoded and refuse them or leave them out (--bad-files), as the
    PyTorch trainer does; every rank calls it. `gather`: every rank's value, in rank order (a collective, for a
    decode shared out and for a barrier); by default Horovod's allgather_object when there are several ranks."""
    if args.data == SYNTHETIC:
        return synthetic_images(args)
    images, _, _ = indexed(args, out, rank, world, gather or (badfiles.one_rank if world == 1 else horovod_gather))
    check_batch_fits(args.batch_size, world, len(images.train.samples))
    if images.val is None:
        log.warning("no val/ folder in %s: training without validation", args.data)
    return images


def indexed(args, out: Path, rank: int, world: int, gather: badfiles.Gather):
    """(images, record, source): --data indexed, without the images --bad-files skip leaves out, with the record of
    the bad ones and where it came from (badfiles.usable_splits)."""
    train, val, record, source = badfiles.usable_splits(
        args, out, layout.index_folder(Path(args.data)), rank, world, gather
    )
    return Images(train, val, train.classes, badfiles.data_facts(args, out, train, val, record)), record, source


def synthetic_images(args) -> Images:
    """Synthetic data's Images: no files, the classes 0 to --num-classes - 1, no facts (as the PyTorch trainer's)."""
    classes = [str(i) for i in range(args.num_classes)]
    return Images(Split(classes, []), None, classes, {})


def horovod_gather(mine: list | None) -> list:
    """Every rank's `mine`, in rank order, through Horovod (imported only when a run has several ranks)."""
    import horovod.tensorflow as hvd  # Horovod: the collective of the ranks' shares of a decode

    return hvd.allgather_object(mine)


def steps_per_epoch(images: Images, args, world: int) -> int:
    """Batches per rank in one epoch: its share of the permutation (ceil(N / world) images) in full batches,
    --steps-per-epoch a cap; synthetic data: --steps-per-epoch, or 100."""
    if args.data == SYNTHETIC:
        return args.steps_per_epoch or SYNTHETIC_STEPS
    full = math.ceil(len(images.train.samples) / world) // args.batch_size
    return min(full, args.steps_per_epoch) if args.steps_per_epoch else full


def train_order(images: Images, args, rank: int, world: int, epoch: int, skip_steps: int = 0):
    """(samples, places): the indexes into images.train.samples of the images this rank trains on in `epoch` after
    `skip_steps` batches, in order, and each one's place in the epoch's padded permutation (its crop's seed)."""
    n, batch = len(images.train.samples), args.batch_size
    padded = np.resize(permutation(n, args.seed, epoch), math.ceil(n / world) * world)  # np.resize repeats the start
    places = np.arange(rank, len(padded), world)[skip_steps * batch : steps_per_epoch(images, args, world) * batch]
    return padded[places], places


def permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's order of `n` images, the same on every rank."""
    return np.random.default_rng([seed % 2**64, epoch]).permutation(n)


def train_dataset(images: Images, args, rank: int, world: int, epoch: int, skip_steps: int = 0) -> tf.data.Dataset:
    """This rank's training batches of `epoch` after the first `skip_steps`: (images, labels), exactly
    steps_per_epoch - skip_steps batches of --batch-size."""
    if args.data == SYNTHETIC:
        return synthetic_batch(args, rank).repeat(max(steps_per_epoch(images, args, world) - skip_steps, 0))
    samples, places = train_order(images, args, rank, world, epoch, skip_steps)
    key = tf.constant([args.seed % 2**63, epoch], tf.int64)
    scale, size, hflip = (args.min_crop_scale, 1.0), args.image_size, args.hflip

    def augmented(path: tf.Tensor, place: tf.Tensor) -> tf.Tensor:
        crop_key, flip_key = tf.unstack(tf.random.experimental.stateless_split(fold_in(key, place), 2))
        image = resized(decode_crop(path, crop_key, scale), [size, size])
        if hflip:
            image = tf.cond(
                tf.random.stateless_uniform([], flip_key) < 0.5, lambda: tf.reverse(image, [1]), lambda: image
            )
        return normalised(image)

    return decoded_batches(images.train, samples, places, augmented, args, drop_remainder=True)


def val_dataset(images: Images, args, rank: int, world: int) -> tf.data.Dataset | None:
    """This rank's validation batches (every world-th image from `rank`, each image on one rank only, the last
    batch partial), or None without a val/ folder."""
    if images.val is None:
        return None
    samples, size = val_order(images, rank, world), args.image_size

    def centred(path: tf.Tensor, place: tf.Tensor) -> tf.Tensor:
        return val_image(path, size)

    return decoded_batches(images.val, samples, samples, centred, args, drop_remainder=False)


def val_image(path: tf.Tensor, size: int) -> tf.Tensor:
    """The image at `path` as validation sees it (and `trainflow predict`): the shorter side resized to
    size/0.875, the centre `size` x `size` crop, normalised."""
    return normalised(centre_crop(shorter_side(decode_whole(path), val_resize(size)), size))


def val_order(images: Images, rank: int, world: int) -> np.ndarray:
    """The indexes into images.val.samples of this rank's validation images: every world-th from `rank`."""
    return np.arange(rank, len(images.val.samples) if images.val else 0, world)


def synthetic_batch(args, rank: int) -> tf.data.Dataset:
    """One random batch (normal images, uniform labels), the rank's own, seeded by --seed + rank, as the PyTorch
    trainer's SyntheticBatches: no I/O and no decode."""
    seed = args.seed + rank
    shape = [args.batch_size, args.image_size, args.image_size, 3]
    batch = tf.random.stateless_normal(shape, [seed, 0])
    labels = tf.random.stateless_uniform([args.batch_size], [seed, 1], 0, args.num_classes, tf.int32)
    return tf.data.Dataset.from_tensors((batch, labels))


def decoded_batches(split: Split, samples, places, image_of, args, drop_remainder: bool) -> tf.data.Dataset:
    """Batches of (image_of(path, place), label) for the `samples` of `split` in order: decoded in
    parallel, each image checked to be there (in_order), prefetched."""
    paths = [split.samples[i][0] for i in samples]
    count = len(paths)
    source = tf.data.Dataset.from_tensor_slices(
        (
            tf.range(count, dtype=tf.int64),
            tf.constant(paths, tf.string, [count]),
            tf.constant([split.samples[i][1] for i in samples], tf.int32, [count]),
            tf.constant(places, tf.int64, [count]),
        )
    )
    decoded = source.map(
        lambda at, path, label, place: (at, image_of(path, place), label),
        num_parallel_calls=parallel_calls(args.loader_workers),
        deterministic=True,
    ).ignore_errors()  # an image that fails is left out here, and named by in_order
    size = args.image_size
    end = tf.data.Dataset.from_tensors((tf.constant(count, tf.int64), tf.zeros([size, size, 3]), tf.constant(-1)))
    expected = source.map(lambda at, path, *_: (at, path)).concatenate(
        tf.data.Dataset.from_tensors((tf.constant(count, tf.int64), tf.constant("")))
    )
    checked = tf.data.Dataset.zip((decoded.concatenate(end), expected)).map(in_order).take(count)
    return checked.batch(args.batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


def parallel_calls(loader_workers: int | str) -> int:
    """Images decoded at once: --loader-workers, or with auto or 0 as many as tf.data finds best (AUTOTUNE: torch's 0
    means no worker process, and tf.data decodes in its own threads whatever the number)."""
    return loader_workers if isinstance(loader_workers, int) and loader_workers > 0 else tf.data.AUTOTUNE


def in_order(decoded: tuple, expected: tuple) -> tuple[tf.Tensor, tf.Tensor]:
    """(image, label) of the next image, which must be the one expected: one that failed to decode was left out, and
    the error names it (its path base64-encoded, then as is)."""
    (at, image, label), (wanted, path) = decoded, expected
    named = tf.strings.join([UNREADABLE, " <", tf.io.encode_base64(path), "> ", path])
    there = tf.debugging.Assert(tf.equal(at, wanted), [named], name="image_decoded")
    with tf.control_dependencies([there]):
        return tf.identity(image), label


def decode_crop(path: tf.Tensor, key: tf.Tensor, scale: tuple[float, float]) -> tf.Tensor:
    """The random-resized crop (not yet resized) of the image at `path` as uint8 HxWx3: a JPEG decodes only its
    crop, unless its end marker is missing (cut short: a crop above the cut would decode, one below not)."""
    content = tf.io.read_file(path)

    def jpeg() -> tf.Tensor:
        shape = tf.io.extract_jpeg_shape(checked_size(content))
        return tf.io.decode_and_crop_jpeg(content, crop_box(shape[0], shape[1], key, scale), channels=3)

    def whole() -> tf.Tensor:
        image = decoded(content, path)
        box = crop_box(tf.shape(image)[0], tf.shape(image)[1], key, scale)
        return image[box[0] : box[0] + box[2], box[1] : box[1] + box[3]]

    end = tf.strings.substr(content, tf.maximum(tf.strings.length(content) - 2, 0), 2)
    croppable = is_jpeg(content) & tf.equal(end, JPEG_END)
    return tf.ensure_shape(tf.cond(croppable, jpeg, whole), [None, None, 3])


def decode_whole(path: tf.Tensor) -> tf.Tensor:
    """The image at `path`, whole, as uint8 HxWx3."""
    return decoded(tf.io.read_file(path), path)


def decoded(content: tf.Tensor, path: tf.Tensor) -> tf.Tensor:
    """The image file `content` (read from `path`) as RGB uint8 HxWx3: a JPEG, PNG or GIF (its first frame)
    decoded by TensorFlow (grayscale, CMYK, alpha and 16 bits converted), after the check of its size that PIL makes;
    anything else by PIL, as the PyTorch trainer decodes it (BMP, TIFF, WebP...; what is no image, PIL says why)."""
    image = tf.cond(tf_reads(content), lambda: tf_decode(content), lambda: pil_decode(path))
    return tf.ensure_shape(image, [None, None, 3])


def tf_decode(content: tf.Tensor) -> tf.Tensor:
    """A JPEG, PNG or GIF, by TensorFlow, once its header claims no more pixels than PIL decodes."""
    image = tf.io.decode_image(checked_size(content), channels=3, expand_animations=False)
    return tf.ensure_shape(image, [None, None, 3])


def pil_decode(path: tf.Tensor) -> tf.Tensor:
    """The image at `path`, decoded by PIL (image_files.load_rgb) in a numpy_function."""

    def rgb(name) -> np.ndarray:  # name: the path's bytes, or a 0-d array of them
        return np.asarray(image_files.load_rgb(np.asarray(name).item().decode("utf-8")))

    return tf.ensure_shape(tf.numpy_function(rgb, [path], tf.uint8, stateful=False), [None, None, 3])


def tf_reads(content: tf.Tensor) -> tf.Tensor:
    """Whether `content` starts as a JPEG, PNG or GIF does: formats TensorFlow decodes as PIL does (not BMP: it
    refuses 1- and 4-bit ones, which PIL reads)."""
    return is_jpeg(content) | starts(content, PNG) | starts(content, GIF)


def checked_size(content: tf.Tensor) -> tf.Tensor:
    """`content`, once its header claims no more pixels than PIL decodes (its guard against decompression bombs,
    which the PyTorch trainer has): an image that claims more fails, before anything is allocated for it."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS or 2**62
    fits = tf.debugging.assert_less_equal(claimed_pixels(content), tf.constant(limit, tf.int64))
    with tf.control_dependencies([fits]):
        return tf.identity(content)


def claimed_pixels(content: tf.Tensor) -> tf.Tensor:
    """Width x height as the header of a JPEG, PNG or GIF says (int64); 0 for other content."""

    def jpeg() -> tf.Tensor:
        return tf.reduce_prod(tf.cast(tf.io.extract_jpeg_shape(content)[:2], tf.int64))

    def png() -> tf.Tensor:  # IHDR: width and height, big-endian
        return header_number(content, 16, 4, "big") * header_number(content, 20, 4, "big")

    def gif() -> tf.Tensor:  # the logical screen, as PIL sizes a GIF
        return header_number(content, 6, 2) * header_number(content, 8, 2)

    return tf.case(
        [
            (is_jpeg(content), jpeg),
            (starts(content, PNG), png),
            (starts(content, GIF), gif),
        ],
        default=lambda: tf.constant(0, tf.int64),
    )


def header_number(content: tf.Tensor, at: int, size: int, order: str = "little") -> tf.Tensor:
    """The unsigned integer of `size` bytes at `at` in `content` (int64), in byte `order` ("little" or "big")."""
    raw = tf.cast(tf.io.decode_raw(tf.strings.substr(content, at, size), tf.uint8, fixed_length=size), tf.int64)
    weights = tf.constant([256**i for i in range(size)][:: -1 if order == "big" else 1], tf.int64)
    return tf.reduce_sum(raw * weights)


def is_jpeg(content: tf.Tensor) -> tf.Tensor:
    """Whether `content` starts as a JPEG does (SOI)."""
    return starts(content, JPEG_START)


def starts(content: tf.Tensor, magic: bytes) -> tf.Tensor:
    """Whether `content` starts with the bytes `magic`."""
    return tf.equal(tf.strings.substr(content, 0, len(magic)), magic)


def crop_box(height: tf.Tensor, width: tf.Tensor, key: tf.Tensor, scale: tuple[float, float]) -> tf.Tensor:
    """[top, left, h, w] (int32) of a random-resized crop of a `height` x `width` image, as torchvision's
    RandomResizedCrop draws it from its random numbers, here stateless ones from `key`: the first of 10 tries of an
    area (a uniform share of the image's, within `scale`) and an aspect ratio (log-uniform within 3/4 to 4/3) that
    fits, placed uniformly, else the centre crop nearest that range."""
    draws = tf.random.stateless_uniform([4, TRIES], key, dtype=tf.float64)
    h_image, w_image = tf.cast(height, tf.float64), tf.cast(width, tf.float64)
    area = h_image * w_image * (scale[0] + (scale[1] - scale[0]) * draws[0])
    logs = (math.log(RATIO[0]), math.log(RATIO[1]))
    aspect = tf.exp(logs[0] + (logs[1] - logs[0]) * draws[1])
    w, h = tf.round(tf.sqrt(area * aspect)), tf.round(tf.sqrt(area / aspect))  # half to even, as Python's round
    fits = (w > 0) & (w <= w_image) & (h > 0) & (h <= h_image)
    first = tf.argmax(tf.cast(fits, tf.int32))  # the first try that fits (0 when none does)
    top = tf.floor(draws[2][first] * (h_image - h[first] + 1))
    left = tf.floor(draws[3][first] * (w_image - w[first] + 1))
    drawn = tf.stack([top, left, h[first], w[first]])
    return tf.cast(tf.where(tf.reduce_any(fits), drawn, centre_box(h_image, w_image)), tf.int32)


def centre_box(height: tf.Tensor, width: tf.Tensor) -> tf.Tensor:
    """RandomResizedCrop's fallback: the whole image, or its centre with the aspect ratio clipped to 3/4..4/3."""
    ratio = width / height
    w = tf.where(ratio > RATIO[1], tf.round(height * RATIO[1]), width)
    h = tf.where(ratio < RATIO[0], tf.round(width / RATIO[0]), height)
    return tf.stack([tf.floor((height - h) / 2), tf.floor((width - w) / 2), h, w])


def fold_in(key: tf.Tensor, place: tf.Tensor) -> tf.Tensor:
    """The random key of one image of the epoch: the epoch's key with the image's place in its order folded in."""
    return tf.random.experimental.stateless_fold_in(key, place)


def resized(image: tf.Tensor, size) -> tf.Tensor:
    """`image` resized to `size` ([height, width]), float32: bilinear, antialiased when it shrinks, as PIL's and
    torchvision's resize."""
    return tf.image.resize(image, size, method="bilinear", antialias=True)


def shorter_side(image: tf.Tensor, side: int) -> tf.Tensor:
    """`image` resized so its shorter side is `side`, the longer one in proportion, rounded down (torchvision's
    Resize(int))."""
    height, width = tf.cast(tf.shape(image)[0], tf.float64), tf.cast(tf.shape(image)[1], tf.float64)
    short, long = tf.minimum(height, width), tf.maximum(height, width)
    other = tf.cast(tf.floor(side * long / short), tf.int32)
    size = tf.where(height <= width, tf.stack([side, other]), tf.stack([other, side]))
    return resized(image, size)


def centre_crop(image: tf.Tensor, size: int) -> tf.Tensor:
    """The centre `size` x `size` of an image at least that large (torchvision's CenterCrop: offsets rounded)."""
    height, width = tf.shape(image)[0], tf.shape(image)[1]
    top = tf.cast(tf.round(tf.cast(height - size, tf.float64) / 2), tf.int32)
    left = tf.cast(tf.round(tf.cast(width - size, tf.float64) / 2), tf.int32)
    return tf.ensure_shape(image[top : top + size, left : left + size], [size, size, 3])


def normalised(image: tf.Tensor) -> tf.Tensor:
    """Pixels 0 to 255 (float) as ImageNet-normalised float32: (x / 255 - mean) / std."""
    mean, std = tf.constant(MEAN) * 255, tf.constant(STD) * 255
    return (tf.cast(image, tf.float32) - mean) / std


def batches(dataset: tf.data.Dataset) -> Iterator:
    """The batches of `dataset`; an image that fails to decode stops them with the UsageError that names it."""
    try:
        yield from dataset
    except tf.errors.InvalidArgumentError as exc:
        bad = unreadable_image(exc)
        if bad is None:
            raise
        raise bad from None


def unreadable_image(exc: Exception) -> image_files.BadImage | None:
    """The UsageError for the image whose failure to decode `exc` reports (a batch's error; see in_order), as the
    PyTorch trainer's: PIL's reason when PIL fails too, else TensorFlow's; None for any other error."""
    found = re.search(re.escape(UNREADABLE) + r" <([A-Za-z0-9_-]*=*)>", str(exc))
    if found is None:
        return None
    encoded = found.group(1)
    return bad_image(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8"))


def bad_image(path: str) -> image_files.BadImage:
    """The UsageError for the image at `path` that TensorFlow failed to decode, as the PyTorch trainer's: PIL's
    reason when PIL fails too, else TensorFlow's."""
    try:
        image_files.load_rgb(path)
    except image_files.BadImage as bad:
        return bad
    why = tensorflow_problem(path)
    return image_files.BadImage(f"cannot decode image {path} ({why}); replace or remove the file", path, why)


def tensorflow_problem(path: str) -> str:
    """Why TensorFlow does not decode the image at `path` (which PIL decodes), in one line."""
    try:
        tf_decode(tf.io.read_file(path))
    except tf.errors.OpError as exc:
        why = re.sub(r"\{\{.*?\}\}|\[Op:\w+\].*", "", exc.message.strip().splitlines()[0]).strip()
        return f"TensorFlow: {why or type(exc).__name__}"
    return "TensorFlow could not read it while training"
