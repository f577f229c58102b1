"""--loader gpu with the CPU as its device (no GPU here): the workers draw the fast loader's crops and flips, a
thread of the training process decodes, crops, resizes and flips; PNG and CMYK are decoded in the workers; a run
resumes where the fast loader's would; a decode that fails stops the thread and names the file. The model step's
options (--compile-mode, --fused-optimizer) are checked at the end."""

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from infra.data.photos import photo
from nodelib.cores import usable_cores
from nodelib.errors import UsageError
from tests.fakes.image_files import write_image
from tests.fakes.paths import REPO
from trainer import data, gpu_decode, jpeg_crop, train
from trainer.options import build_parser, check_args

# Whole decode then crop (here) against the fast loader's partial decode of the crop (jpeg_crop): libjpeg-turbo's
# pixels either way, then the same uint8 resize. Measured on this machine, 2026-11-27: mean 0, max 0 over the
# photographs below (with and without restart markers, gray too). nvJPEG on a GPU rounds its IDCT and upsampling
# otherwise: the bounds are what a decoder may differ by, not what this one does.
MEAN_ABS_LIMIT, MAX_ABS_LIMIT = 1.0, 2


def photo_tree(root: Path, count: int = 12) -> Path:
    """Photo-like JPEGs of assorted shapes in two classes: colour, gray, some with a restart marker per MCU."""
    rng = np.random.default_rng(7)
    for i in range(count):
        image = photo(rng, (40 + 9 * i, 30 + 5 * (i % 4)))
        path = root / "train" / f"c{i % 2}" / f"{i:02d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        (image.convert("L") if i % 5 == 4 else image).save(path, quality=90)
        if i % 3 == 0 and jpeg_crop.library():
            path.write_bytes(jpeg_crop.add_restarts(path.read_bytes()))
    return root


def batches(root: Path, loader: str, seed: int, workers: int = 0, skip: int = 0, size: int = 24) -> list:
    """Every (images, targets) of one shuffled epoch of root/train through `loader`, as the trainer makes them."""
    train_split, _ = data.index_folder(root)
    torch.manual_seed(seed)
    dataset = data.image_files(train_split, data.train_transform(size, 0.25, True, loader), loader)
    sampler = data.ResumableSampler(dataset, 1, 0, shuffle=True, seed=seed)
    sampler.set_epoch(1)
    sampler.skip = skip
    return list(data.make_loader(dataset, 4, sampler, workers, False, False))


def pixel_gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    """Mean and largest absolute difference of two uint8 batches."""
    diff = (a.int() - b.int()).abs()
    return diff.float().mean().item(), int(diff.max())


def test_the_workers_draw_the_fast_loader_s_crop_boxes_and_flips(tmp_path):
    """With one seed, encode draws the box that the fast loader's crop decodes (the same rectangle of the same
    pixels) and then the same flip."""
    train_split, _ = data.index_folder(photo_tree(tmp_path))
    paths = [path for path, _ in train_split.samples]
    crops = data.CropFirst(24, 0.25, True)
    torch.manual_seed(5)
    fast = [(crops.crop(path), crops.draw_flip()) for path in paths]
    torch.manual_seed(5)
    encoded = [crops.encode(path) for path in paths]
    assert all(isinstance(sample.image, bytes) and sample.box for sample in encoded)  # every one for the device
    assert [flip for _, flip in fast] == [sample.flip for sample in encoded]
    assert len({sample.flip for sample in encoded}) == 2  # both kinds drawn
    for (crop, _), sample in zip(fast, encoded):
        top, left, h, w = sample.box
        whole = data.read_uint8(sample.path)[:, top : top + h, left : left + w]
        assert crop.shape == whole.shape
        mean, largest = pixel_gap(crop, whole)
        assert mean <= MEAN_ABS_LIMIT and largest <= MAX_ABS_LIMIT, sample.path


@pytest.mark.parametrize("workers", [0, 2])
def test_a_seed_gives_the_fast_loader_s_batches(tmp_path, workers):
    """The same batches, in the same order, with the pixels within the stated bounds (the workers forked, or none)."""
    root = photo_tree(tmp_path)
    fast, gpu = batches(root, "fast", 11, workers), batches(root, "gpu", 11, workers)
    assert len(fast) == len(gpu) == 3
    for (fast_images, fast_targets), (gpu_images, gpu_targets) in zip(fast, gpu):
        assert torch.equal(fast_targets, gpu_targets)
        assert gpu_images.dtype == torch.uint8 and gpu_images.shape == fast_images.shape == (4, 3, 24, 24)
        mean, largest = pixel_gap(fast_images, gpu_images)
        assert mean <= MEAN_ABS_LIMIT and largest <= MAX_ABS_LIMIT


def test_without_the_c_library_the_boxes_come_from_pil_s_header_and_are_the_same(tmp_path, monkeypatch):
    """A node without a C compiler (jpeg_crop unavailable): PIL reads the JPEG headers, and the same seed draws the
    same boxes and flips as with jpeg_crop's reader; CMYK still goes to the worker's CPU decode."""
    root = photo_tree(tmp_path / "data")
    write_image(root / "train" / "c1" / "cmyk.jpg", "CMYK", fmt="JPEG")
    paths = [path for path, _ in data.index_folder(root)[0].samples]
    crops = data.CropFirst(24, 0.25, True)
    draws = {}
    for compiler in ("", "/bin/false"):
        monkeypatch.setenv(jpeg_crop.DIR, str(tmp_path / f"cache{len(compiler)}"))
        monkeypatch.setenv("CC", compiler)
        jpeg_crop._load.cache_clear()
        try:
            assert (jpeg_crop.library() is None) == bool(compiler)
            torch.manual_seed(9)
            draws[compiler] = [crops.encode(path)[1:3] for path in paths]
        finally:
            jpeg_crop._load.cache_clear()
    assert draws["/bin/false"] == draws[""]
    assert sum(box is None for box, _ in draws[""]) == 1  # the CMYK one


def test_png_cmyk_and_gray_are_decoded_in_the_workers_as_the_fast_loader_decodes_them(image_tree):
    """What the device's JPEG decoder cannot take (PNG, palettes, CMYK) is decoded and cropped on the CPU, in the
    worker, shipped as a uint8 crop; the batch still equals the fast loader's."""
    train_split, _ = data.index_folder(image_tree)
    crops = data.CropFirst(8, 0.5, True)
    torch.manual_seed(2)
    encoded = {Path(path).name: crops.encode(path) for path, _ in train_split.samples}
    for name in ("cmyk.jpg", "rgba.png", "gray.png", "palette transparent.png"):
        assert isinstance(encoded[name].image, torch.Tensor) and encoded[name].box is None, name
        assert encoded[name].image.dtype == torch.uint8 and encoded[name].image.shape[0] == 3
    assert isinstance(encoded["plain.JPEG"].image, bytes)
    fast, gpu = batches(image_tree, "fast", 4, size=8), batches(image_tree, "gpu", 4, size=8)
    assert torch.equal(torch.cat([t for _, t in fast]), torch.cat([t for _, t in gpu]))
    assert torch.equal(torch.cat([i for i, _ in fast]), torch.cat([i for i, _ in gpu]))


def test_a_resumed_epoch_starts_where_the_fast_loader_s_would(tmp_path):
    """ResumableSampler.skip: the batches after the skipped ones are the fast loader's, in its order."""
    root = photo_tree(tmp_path)
    whole = batches(root, "fast", 3)
    fast, gpu = batches(root, "fast", 3, skip=4), batches(root, "gpu", 3, skip=4)
    assert len(fast) == len(gpu) == len(whole) - 1
    assert [t.tolist() for _, t in gpu] == [t.tolist() for _, t in fast] == [t.tolist() for _, t in whole[1:]]
    for (fast_images, _), (gpu_images, _) in zip(fast, gpu):
        assert pixel_gap(fast_images, gpu_images)[0] <= MEAN_ABS_LIMIT


def test_evaluation_is_the_fast_loader_s_resize_and_centre_crop(tmp_path):
    root = photo_tree(tmp_path)
    write_image(root / "train" / "c0" / "odd.png", "P", size=30)
    train_split, _ = data.index_folder(root)
    sampler = data.ShardSampler(len(train_split.samples), 0, 1)
    made = {
        loader: torch.cat(
            [
                i
                for i, _ in data.make_loader(
                    data.image_files(train_split, data.val_transform(16, loader), loader), 5, sampler, 0, False, False
                )
            ]
        )
        for loader in ("fast", "gpu")
    }
    assert made["gpu"].shape == (13, 3, 16, 16)
    assert torch.equal(made["fast"], made["gpu"])


def test_the_workers_never_make_a_device_tensor(tmp_path):
    """A worker's sample is the file's bytes or a CPU tensor, and nothing it does starts CUDA (workers fork: CUDA
    cannot be used in them)."""
    root = photo_tree(tmp_path)
    write_image(root / "train" / "c1" / "cmyk.jpg", "CMYK", fmt="JPEG")
    train_split, _ = data.index_folder(root)
    for transform in (data.train_transform(16, 0.25, True, "gpu"), data.val_transform(16, "gpu")):
        dataset = data.image_files(train_split, transform, "gpu")
        for i in range(len(dataset)):
            sample, _ = dataset[i]
            assert isinstance(sample.image, bytes) or sample.image.device.type == "cpu"
    assert not torch.cuda.is_initialized()


def corrupt_jpeg(path: Path) -> Path:
    """A JPEG with a whole header and its end marker whose scan holds stray start-of-frame markers: the header
    passes, decoding fails (libjpeg-turbo in torchvision and in PIL alike)."""
    good = path.with_suffix(".tmp")
    photo(np.random.default_rng(0), (160, 160)).save(good, "JPEG", quality=90)
    content = good.read_bytes()
    good.unlink()
    path.write_bytes(content[:1000] + b"\xff\xc0" * 400 + content[1800:])
    return path


def decode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "trainflow-decode"]


@pytest.fixture
def new_decode_threads():
    """The decode threads alive now that were not when the test began: another test's epoch left unclosed stops
    when the garbage collector takes it, not at the test's end."""
    before = set(decode_threads())
    return lambda: set(decode_threads()) - before


def cut_short(path: Path) -> bytes:
    photo(np.random.default_rng(5), (80, 60)).save(path, "JPEG", quality=90)
    return path.read_bytes()[:400]


@pytest.mark.parametrize(
    "content",
    [b"", b"\xff\xd8\xff\xe0" + b"\0" * 40, b"\x89PNG\r\n\x1a\n" + b"\0" * 40, cut_short],
    ids=["empty", "jpeg-header-only", "png-header-only", "jpeg-cut-short"],
)
def test_a_bad_file_is_named_as_the_fast_loader_names_it(tmp_path, content, new_decode_threads):
    """What the header already gives away is decoded in the worker by the fast loader's path: the same message."""
    root = photo_tree(tmp_path, count=8)
    bad = root / "train" / "c0" / "bad.jpg"
    bad.write_bytes(content(bad) if callable(content) else content)
    said = {}
    for loader in ("fast", "gpu"):
        with pytest.raises(UsageError, match=f"image {re.escape(str(bad))} \\(.+\\); replace or remove") as caught:
            batches(root, loader, 0, workers=1)
        said[loader] = str(caught.value).strip().splitlines()[-1]
    assert said["gpu"] == said["fast"]
    assert not new_decode_threads()


def test_a_jpeg_that_fails_only_when_decoded_is_named_and_the_thread_stops(tmp_path, new_decode_threads):
    """The batch the device refuses is decoded one by one, then on the CPU, which names the file; the exception is
    raised in the training thread, and the decode thread is gone (no hang). (The fast loader decodes only a crop:
    it names such a file when the crop reaches the damage.)"""
    root = photo_tree(tmp_path, count=8)
    bad = corrupt_jpeg(root / "train" / "c0" / "bad.jpg")
    assert data.decodable(bad.read_bytes())  # the header alone cannot tell: only decoding finds it
    with pytest.raises(UsageError, match=f"cannot decode image {re.escape(str(bad))} \\(.+\\); replace or remove"):
        batches(root, "gpu", 0, workers=1)
    assert not new_decode_threads()


def test_a_batch_the_decoder_refuses_is_decoded_one_by_one_and_on_the_cpu(tmp_path):
    """One sample the device's decoder cannot take (a PNG's bytes stand in for a progressive JPEG that nvJPEG refuses)
    makes the batched call fail: the JPEGs are then decoded one by one, that one by data.read_uint8 on the CPU."""
    root = photo_tree(tmp_path, count=3)
    png = write_image(root / "train" / "c0" / "z.png", "RGB", size=20)
    train_split, _ = data.index_folder(root)
    samples = [gpu_decode.Encoded(Path(path).read_bytes(), None, False, path) for path, _ in train_split.samples]
    asked = []

    def read(path: str) -> torch.Tensor:
        asked.append(path)
        return data.read_uint8(path)

    tally = gpu_decode.new_tally()
    images = gpu_decode.decode_images(samples, read, torch.device("cpu"), tally)
    assert asked == [str(png)] and tally == {"batches": 0, "batches_decoded_at_once": 0, "images_decoded_on_cpu": 1}
    for image, sample in zip(images, samples):
        assert torch.equal(image, data.read_uint8(sample.path))


def test_the_decode_thread_raises_in_the_consumer_and_stops_when_the_consumer_does(new_decode_threads):
    def failing():
        yield 1
        raise ValueError("decoder broke")

    with pytest.raises(ValueError, match="decoder broke"), gpu_decode.Prefetch(failing(), 2) as ready:
        assert list(ready) == [1]
    assert not new_decode_threads()
    endless = gpu_decode.Prefetch(iter(range(10**9)), 2)
    with endless as ready:
        assert next(iter(ready)) == 0  # a consumer that stops early (--steps-per-epoch): the thread stops too
    assert not endless.thread.is_alive()


def test_leaving_never_waits_forever_on_a_thread_that_waits_for_the_leaver():
    """An unclosed epoch is left where the garbage collector takes it, perhaps in a thread holding a lock that the
    decode thread waits for: the leaver waits for the thread a bounded time, and the thread stops once it can."""
    held = threading.Lock()

    def source():
        yield 0
        with held:  # the decode thread waits here while the consumer holds the lock
            yield 1

    prefetch = gpu_decode.Prefetch(source(), 1, join_s=0.2)
    with held:
        with prefetch as ready:
            assert next(iter(ready)) == 0
        assert prefetch.thread.is_alive()  # left without a deadlock: the thread still waits for the lock
    prefetch.thread.join()  # the lock released, it takes its item, sees the stop and ends


def test_a_consumer_that_leaves_an_epoch_early_stops_the_thread(tmp_path, new_decode_threads):
    root = photo_tree(tmp_path)
    train_split, _ = data.index_folder(root)
    dataset = data.image_files(train_split, data.train_transform(16, 0.25, True, "gpu"), "gpu")
    loader = data.make_loader(dataset, 2, data.ShardSampler(len(dataset), 0, 1), 1, False, True)
    for _ in range(2):  # persistent workers: a second epoch after the first was left early
        epoch = iter(loader)
        images, targets = next(epoch)
        assert images.shape == (2, 3, 16, 16) and len(targets) == 2
        epoch.close()
        assert not new_decode_threads()
    assert len(list(loader)) == len(loader) == 6


# The model step's options, for the GPU benchmark.


def parse(*extra: str):
    args = build_parser().parse_args(["--data", "synthetic", "--out", "out", *extra])
    check_args(args)
    return args


@pytest.mark.parametrize("choice, fused", [("auto", True), ("on", True), ("off", None)])
def test_the_fused_optimizer_option_picks_the_sgd_implementation(choice, fused):
    args = parse("--fused-optimizer", choice)
    optimizer = train.make_optimizer(args, torch.nn.Linear(2, 2), torch.device("cpu"))
    assert optimizer.defaults["fused"] is fused


def test_a_compile_mode_needs_a_compiled_model():
    assert parse("--compile", "on", "--compile-mode", "max-autotune").compile_mode == "max-autotune"
    assert parse("--compile-mode", "reduce-overhead").compile == "auto"  # auto compiles on a GPU
    with pytest.raises(UsageError, match="--compile-mode reduce-overhead needs a compiled model"):
        parse("--compile", "off", "--compile-mode", "reduce-overhead")
    with pytest.raises(UsageError, match="needs a compiled model"):
        parse("--compile-mode", "max-autotune", "--parallel", "pipeline", "--stages", "2")


def test_a_compile_mode_reaches_torch_compile():
    model = train.compile_model(torch.nn.Linear(2, 2), "on", torch.device("cpu"), "max-autotune-no-cudagraphs")
    assert isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
    assert train.compile_model(model, "auto", torch.device("cpu"), "reduce-overhead") is model  # auto: not on a CPU


def test_auto_picks_the_gpu_loader_only_where_torchvision_decodes_on_a_cuda_device(caplog):
    caplog.set_level("INFO", logger="trainer")
    assert train.choose_loader("auto", torch.device("cpu")) == "fast"
    assert "loader: fast (--loader auto: cpu is not a CUDA device)" in caplog.text
    assert train.choose_loader("gpu", torch.device("cpu")) == "gpu"  # a loader asked for by name is that one


@pytest.mark.parametrize(
    "loader, device, cores, workers",
    [
        ("gpu", "cuda", 16, 4),  # a few: they only read the files
        ("gpu", "cuda", 3, 1),  # two cores kept for the training process and its decode thread
        ("dali", "cuda", 16, 6),  # NVIDIA's threads a GPU
        ("fast", "cuda", 16, 12),  # a quarter of the cores kept for the training process
        ("pil", "cuda", 2, 1),
        ("fast", "cpu", 16, 4),  # the model's threads take three quarters
        ("fast", "cpu", 2, 1),
    ],
)
def test_auto_loader_workers_follow_the_cores_and_the_loader(loader, device, cores, workers):
    assert train.loader_workers_for(loader, device, cores)[0] == workers


def test_auto_loader_workers_share_the_cores_among_the_local_processes_and_say_so(caplog):
    caplog.set_level("INFO", logger="trainer")
    cores = usable_cores()
    chosen = train.choose_loader_workers("auto", "fast", torch.device("cpu"), 1)
    assert chosen == max(1, cores // 4)
    assert f"loader workers: {chosen} (--loader-workers auto: {cores} cores a training process; " in caplog.text
    shared = train.choose_loader_workers("auto", "fast", torch.device("cuda"), cores)  # one core each
    assert shared == 1
    assert train.choose_loader_workers(3, "fast", torch.device("cpu"), 1) == 3  # a number asked for is that one


# In a process of its own: the probe of a CUDA device must not start CUDA in the test process (see above).
ON_CUDA = """
import torch
from trainer import gpu_decode, train
from nodelib.errors import UsageError
try:
    gpu_decode.check_device(torch.device("cuda"))
except UsageError as exc:
    print("refused:", exc)
print("auto:", train.choose_loader("auto", torch.device("cuda")))
"""


def test_without_a_gpu_the_gpu_loader_is_refused_naming_the_fix_and_auto_picks_fast():
    done = subprocess.run(
        [sys.executable, "-c", ON_CUDA],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'containers'}"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    refused, auto = done.stdout.strip().splitlines()[-2:]
    assert refused.startswith("refused: --loader gpu cannot decode JPEGs on cuda (") and refused.endswith(
        "); install a torchvision built with CUDA (its nvJPEG decoder), or pass --loader fast"
    )
    assert auto == "auto: fast"


def whole_samples(root: Path) -> list:
    """Every training JPEG of `root` as a worker encodes it for the device, its crop the whole image."""
    train_split, _ = data.index_folder(root)
    return [gpu_decode.Encoded(Path(path).read_bytes(), None, False, path) for path, _ in train_split.samples]


# What a GPU raises when a batch does not fit: torchvision's batched decode catches torch's OutOfMemoryError (a
# std::exception) and raises its message in a RuntimeError (decode_jpegs_cuda.cpp); the kernel's allocations raise
# torch's own. No GPU here to run out of memory: the calls raise what they raise when one does.
DECODER_OOM = RuntimeError("Error while decoding JPEG images: CUDA out of memory. Tried to allocate 2.00 GiB")
TORCH_OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize(
    ("failing", "error"), [("on_device", DECODER_OOM), ("on_device", TORCH_OOM), ("finish_batch", TORCH_OOM)]
)
def test_a_batch_that_runs_the_device_out_of_memory_is_one_line_naming_the_largest_image(
    tmp_path, monkeypatch, failing, error
):
    root = photo_tree(tmp_path, count=6)
    samples = whole_samples(root)

    def full(*args):
        raise error

    monkeypatch.setattr(gpu_decode, failing, full)
    steps = data.train_transform(16, 0.25, True, "gpu")
    with pytest.raises(UsageError) as caught:
        gpu_decode.decode_batch(samples, steps, torch.device("cpu"))
    largest = max((s.path for s in samples), key=lambda path: np.prod(data.decodable(Path(path).read_bytes())))
    width, height = data.decodable(Path(largest).read_bytes())
    assert str(caught.value) == (
        f"cpu ran out of memory decoding a batch of 6 images; the largest, {largest}, is {width}x{height} px: stage "
        "the photos shrunk (--max-side 500 on trainflow run or stage), or lower --batch-size"
    )


def test_an_image_the_device_decodes_turned_is_decoded_on_the_cpu_as_its_crop_was_drawn(tmp_path, monkeypatch):
    """A decoder that turns images by their EXIF orientation (newer torchvision's nvJPEG path) swaps their sides:
    the crop boxes, drawn from the headers, would then reach outside them. Such an image is decoded on the CPU."""
    samples = [s._replace(box=(0, 0, *data.read_uint8(s.path).shape[-2:])) for s in whole_samples(photo_tree(tmp_path))]
    decode = gpu_decode.on_device
    monkeypatch.setattr(gpu_decode, "on_device", lambda *args: [image.transpose(-2, -1) for image in decode(*args)])
    tally = gpu_decode.new_tally()
    images = gpu_decode.decode_images(samples, data.read_uint8, torch.device("cpu"), tally)
    square = [s for s in samples if s.box[2] == s.box[3]]  # turned, a square image still fits its box
    assert tally["images_decoded_on_cpu"] == len(samples) - len(square) > 0
    for image, sample in zip(images, samples):
        assert image.shape[-2:] == sample.box[2:] or sample in square


def test_a_gpu_whose_batch_kernel_cannot_run_is_refused_naming_the_fix():
    """Triton cannot launch on this machine (no GPU driver): the refusal names it, and what to install."""
    with pytest.raises(UsageError) as caught:
        gpu_decode.check_kernel([torch.zeros(3, 8, 8, dtype=torch.uint8)])
    assert str(caught.value).startswith("--loader gpu cannot run its batch kernel on cpu (")
    assert str(caught.value).endswith(
        "); install the Triton that torch's CUDA build requires (pip install triton) and a C compiler (gcc), or pass "
        "--loader fast"
    )
