"""--loader gpu's batch kernel (containers/trainer/batch_resize.py, resize_kernel.py) run by Triton's interpreter on
the CPU (no GPU here): the pixels of the per-image path it replaces on a GPU (crop, torchvision's v2 antialiased
resize, flip; evaluation's resize and centre crop), for the regions the loader's own steps give; and the batch the
workers hand over, its bytes in one tensor in shared memory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from tests.fakes.image_files import write_image
from tests.fakes.paths import REPO
from tests.unit.trainer.test_gpu_loader import photo_tree
from trainer import data, gpu_decode
from trainer.batch_resize import centre_region, crop_region

# The per-image path rounds to uint8 between its two separable passes (torch's uint8 resize on the CPU); the
# kernel sums both dimensions in float32 and rounds once. The bound: 2 levels of 255 on every pixel.
MAX_ABS_LIMIT, MEAN_ABS_LIMIT = 2, 0.5

# Run with TRITON_INTERPRET=1 set before triton is imported, so in a process of its own.
COMPARE = """
import json, sys
from pathlib import Path
import torch
from trainer import data, gpu_decode
from trainer.batch_resize import resize_batch

root, size = Path(sys.argv[1]), int(sys.argv[2])
split, _ = data.index_folder(root)
gaps = {}
for kind, steps in (("train", data.train_transform(size, 0.1, True, "gpu")), ("val", data.val_transform(size, "gpu"))):
    torch.manual_seed(0)
    samples = [steps.encode(path) for path, _ in split.samples]
    images = gpu_decode.decode_images(samples, steps.read, torch.device("cpu"))
    regions = [steps.region(s.box, i.shape[-2], i.shape[-1], s.flip) for i, s in zip(images, samples)]
    made = resize_batch(images, regions, size)
    wanted = torch.stack([gpu_decode.finish(i, s, steps.resize) for i, s in zip(images, samples)])
    gap = (made.int() - wanted.int()).abs()
    gaps[kind] = {
        "max": int(gap.max()), "mean": gap.float().mean().item(), "shape": list(made.shape),
        "channels_last": made.is_contiguous(memory_format=torch.channels_last),
        "flipped": sum(s.flip for s in samples), "cropped": sum(s.box is not None for s in samples),
    }
print(json.dumps(gaps))
"""


def test_the_kernel_makes_the_per_image_path_s_pixels_for_training_and_evaluation(tmp_path):
    root = photo_tree(tmp_path, count=6)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}:{REPO / 'containers'}"}
    done = subprocess.run(
        [sys.executable, "-c", COMPARE, str(root), "16"], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    gaps = json.loads(done.stdout.strip().splitlines()[-1])
    for kind, gap in gaps.items():
        assert gap["shape"] == [6, 3, 16, 16] and gap["channels_last"], (kind, gap)
        assert gap["max"] <= MAX_ABS_LIMIT and gap["mean"] <= MEAN_ABS_LIMIT, (kind, gap)
    assert gaps["train"]["flipped"] and gaps["train"]["cropped"] == 6  # the draws reached the kernel


# Triton's own compiler, down to the GPU's machine code (ptxas ships with Triton), needs no GPU: what the interpreter
# cannot say, that the kernel compiles for the GPUs the loader is for, is checked here. A cache of its own: compiled.
COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from trainer.resize_kernel import BLOCK, resize

types = {"pixels": "*u8", "meta": "*i64", "geometry": "*fp32", "out": "*u8", "size": "i32", "BLOCK": "constexpr"}
source = ASTSource(fn=resize, signature=types, constexprs={"BLOCK": BLOCK})
for arch in map(int, sys.argv[1:]):
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32))
    print(arch, len(kernel.asm["cubin"]), ".target sm_%d" % arch in kernel.asm["ptx"])
"""


def test_the_kernel_compiles_to_machine_code_for_hopper_and_ampere(tmp_path):
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": f"{REPO}:{REPO / 'containers'}"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, "90", "80"], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = {arch: (int(size), ptx == "True") for arch, size, ptx in map(str.split, done.stdout.strip().splitlines())}
    assert set(built) == {"90", "80"} and all(size > 0 and ptx for size, ptx in built.values()), built


@pytest.mark.parametrize("height, width", [(300, 400), (400, 300), (50, 50), (57, 1000), (33, 32)])
def test_evaluation_s_region_is_torchvision_s_resize_then_centre_crop(height, width):
    """Resize(val_resize(32)) of the shorter side, the longer in proportion, then CenterCrop(32): the scales of
    the resized image's size, and the offsets of the pixel that CenterCrop keeps first."""
    region = centre_region(None, height, width, False, 32)
    resized = data.val_transform(32, "fast").transforms[0](torch.zeros(3, height, width, dtype=torch.uint8))
    rows, columns = resized.shape[-2:]
    assert (region.scale_y, region.scale_x) == (height / rows, width / columns)
    first = int(v2.functional.center_crop(torch.arange(rows * columns).reshape(1, rows, columns), [32, 32])[0, 0, 0])
    assert (region.shift_y, region.shift_x) == divmod(first, columns)


def test_a_training_region_is_its_box_or_the_whole_crop_the_worker_made():
    assert crop_region((5, 7, 64, 32), 100, 80, True, 16)[:7] == (5, 7, 64, 32, 4.0, 2.0, 0)
    assert crop_region(None, 48, 24, False, 16)[:6] == (0, 0, 48, 24, 3.0, 1.5)


def test_a_worker_hands_over_the_batch_s_bytes_in_one_shared_tensor(tmp_path):
    """The JPEGs' bytes in one tensor in shared memory (pickled as a handle), each sample a view of its file's
    bytes; a PNG decoded (and cropped) in the worker travels beside them."""
    root = photo_tree(tmp_path, count=8)
    png = write_image(root / "train" / "c1" / "z.png", "RGB", size=20)
    split, _ = data.index_folder(root)
    dataset = data.image_files(split, data.train_transform(16, 0.25, True, "gpu"), "gpu")
    loader = DataLoader(dataset, batch_size=len(dataset), num_workers=1, collate_fn=gpu_decode.collate)
    batch = next(iter(loader))
    assert batch.jpegs.is_shared() and sum(batch.lengths) == batch.jpegs.numel()
    jpegs = [s for s in batch.samples if gpu_decode.is_jpeg(s)]
    assert [bytes(s.image.numpy()) for s in jpegs] == [Path(s.path).read_bytes() for s in jpegs] and len(jpegs) == 8
    [decoded] = [s for s in batch.samples if not gpu_decode.is_jpeg(s)]
    assert decoded.path == str(png) and decoded.image.dim() == 3 and decoded.box is None
