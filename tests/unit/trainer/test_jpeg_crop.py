"""The fast loader's partial JPEG decoding (trainer/jpeg_crop.c): compiled here with the machine's cc and
libjpeg-turbo, as the trainer compiles it, and compared pixel for pixel with a whole decode."""

import re

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms
from torchvision.io import ImageReadMode, decode_jpeg, read_file

from nodelib.errors import UsageError
from tests.fakes.image_files import write_image
from trainer import data, jpeg_crop


def photo(path, width=203, height=117, mode="RGB", **save) -> bytes:
    """A JPEG with smooth fields and grain (so every block has detail), odd sizes (partial iMCUs at the edges)."""
    rng = np.random.default_rng(width * height)
    base = Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
    pixels = np.clip(np.asarray(base, dtype=np.float32) + rng.normal(0, 20, (height, width, 3)), 0, 255)
    Image.fromarray(pixels.astype(np.uint8)).convert(mode).save(path, quality=90, **save)
    return path.read_bytes()


def boxes(width, height, n, seed=0):
    """Random rectangles, and the corners and edges, where iMCU boundaries and the image's borders meet."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        w, h = int(rng.integers(1, width + 1)), int(rng.integers(1, height + 1))
        yield int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    yield from [
        (0, 0, height, width),
        (0, 0, 1, 1),
        (height - 1, width - 1, 1, 1),
        (16, 16, 16, 16),
        (15, 17, 33, 31),
        (0, width - 17, height, 17),
    ]


@pytest.mark.parametrize("kind", ["4:2:0", "4:4:4", "4:2:2", "gray", "progressive"])
def test_a_decoded_crop_holds_the_pixels_of_a_whole_decode(tmp_path, kind):
    save = {
        "4:2:0": {"subsampling": 2},
        "4:4:4": {"subsampling": 0},
        "4:2:2": {"subsampling": 1},
        "gray": {},
        "progressive": {"progressive": True, "subsampling": 2},
    }[kind]
    path = tmp_path / "photo.jpg"
    jpeg = photo(path, mode="L" if kind == "gray" else "RGB", **save)
    whole = decode_jpeg(read_file(str(path)), mode=ImageReadMode.RGB)
    assert jpeg_crop.library() is not None, jpeg_crop.unavailable()
    for top, left, h, w in boxes(203, 117, 60):
        crop = jpeg_crop.decode_crop(jpeg, top, left, h, w)
        assert crop.shape == (3, h, w) and crop.dtype == torch.uint8
        assert torch.equal(crop, whole[:, top : top + h, left : left + w]), (top, left, h, w)


MCU_WIDTH = {"4:2:0": 16, "4:2:2": 16, "4:4:4": 8, "gray": 8}  # a 203-pixel row: 13, 13, 26 and 26 MCUs


@pytest.mark.parametrize("kind", list(MCU_WIDTH))
@pytest.mark.parametrize("interval", [1, 2, 13])
def test_a_crop_of_a_jpeg_with_restart_markers_holds_the_pixels_of_a_whole_decode(tmp_path, kind, interval):
    """add_restarts is lossless; where its interval divides a row of MCUs only the crop's intervals are decoded
    (cuttable), elsewhere the file is decoded the usual way: the same pixels either way, edges and corners too."""
    save = {"4:2:0": {"subsampling": 2}, "4:4:4": {"subsampling": 0}, "4:2:2": {"subsampling": 1}, "gray": {}}[kind]
    path = tmp_path / "photo.jpg"
    original = photo(path, mode="L" if kind == "gray" else "RGB", **save)
    marked = jpeg_crop.add_restarts(original, interval)
    whole = decode_jpeg(read_file(str(path)), mode=ImageReadMode.RGB)
    assert torch.equal(
        decode_jpeg(torch.frombuffer(bytearray(marked), dtype=torch.uint8), mode=ImageReadMode.RGB), whole
    )
    assert not jpeg_crop.cuttable(original)
    assert jpeg_crop.cuttable(marked) == ((203 + MCU_WIDTH[kind] - 1) // MCU_WIDTH[kind] % interval == 0)
    assert jpeg_crop.info(marked) == (203, 117, 1 if kind == "gray" else 3)
    for top, left, h, w in boxes(203, 117, 60):
        assert torch.equal(jpeg_crop.decode_crop(marked, top, left, h, w), whole[:, top : top + h, left : left + w])


@pytest.mark.parametrize("subsampling", [2, 1])
@pytest.mark.parametrize("restarts", [False, True])
def test_crops_a_few_pixels_wide_at_the_edges_keep_the_upsampling_of_a_whole_decode(tmp_path, subsampling, restarts):
    """libjpeg upsamples the chroma of a region at most 2 samples wide without its fancy filter: a crop of 1 to 3
    pixels at the left edge, or in a last MCU column 4 pixels wide (100 = 6 x 16 + 4), is widened so it keeps the
    whole decode's pixels."""
    path = tmp_path / "photo.jpg"
    jpeg = photo(path, 100, 75, subsampling=subsampling)
    jpeg = jpeg_crop.add_restarts(jpeg) if restarts else jpeg
    whole = decode_jpeg(read_file(str(path)), mode=ImageReadMode.RGB)
    for left in (0, 1, 2, 96, 97, 98, 99):
        for w in range(1, min(3, 100 - left) + 1):
            for top, h in ((0, 5), (10, 5), (30, 3), (74, 1)):
                crop = jpeg_crop.decode_crop(jpeg, top, left, h, w)
                assert torch.equal(crop, whole[:, top : top + h, left : left + w]), (top, left, h, w)


def test_a_rewrite_that_fails_late_frees_its_buffer_once(tmp_path):
    """A JPEG whose coefficient the encoder refuses (a 12-bit DC difference in an 8-bit file) behind a 10 KB APP1
    segment: the rewrite fails after its output buffer has grown (moved), and is refused, not freed twice."""
    tiny = bytes.fromhex(
        "ffd8ffdb0043000101010101010101010101010101010101010101010101010101010101010101010101010101010101"
        "0101010101010101010101010101010101010101010101ffc0000b080008000801011100ffc400260001000000000000"
        "0000000000000000000c100100000000000000000000000000000000ffda0008010100003f004003ffd9"
    )
    crafted = tiny[:2] + b"\xff\xe1" + (10_002).to_bytes(2, "big") + bytes(10_000) + tiny[2:]
    with pytest.raises(jpeg_crop.JpegError, match="DCT coefficient out of range"):
        jpeg_crop.add_restarts(crafted)


def restart_intervals(jpeg: bytes) -> list[tuple[int, int]]:
    """(start, end) of each restart interval's entropy-coded bytes: after the scan header, between RST markers."""
    scan = jpeg.index(b"\xff\xda")
    at = scan + 2 + int.from_bytes(jpeg[scan + 2 : scan + 4], "big")
    starts = [at] + [m.end() for m in re.finditer(rb"\xff[\xd0-\xd7]", jpeg[at:])]
    starts = [at] + [at + s for s in starts[1:]]
    ends = [s - 2 for s in starts[1:]] + [len(jpeg) - 2]
    return list(zip(starts, ends))


def test_only_the_crops_restart_intervals_are_read(tmp_path):
    """A rewritten 500x375 JPEG (4:2:0: 32 x 24 MCUs of 16 px) whose every interval above the crop or left of it is
    overwritten with zeros still gives the crop's exact pixels: nothing outside the crop's MCUs (and the one pixel
    around them) is decoded (libjpeg's partial decoding would entropy-decode every row above the crop)."""
    path = tmp_path / "photo.jpg"
    marked = jpeg_crop.add_restarts(photo(path, 500, 375, subsampling=2))
    whole = decode_jpeg(read_file(str(path)), mode=ImageReadMode.RGB)
    top, left, h, w = 200, 300, 100, 150  # MCU rows 12-18 and columns 18-28 with the pixel around the crop
    spoiled = bytearray(marked)
    intervals = restart_intervals(marked)
    assert len(intervals) == 32 * 24
    for k, (start, end) in enumerate(intervals):
        if k // 32 < 12 or k % 32 < 18:
            spoiled[start:end] = bytes(end - start)
    assert bytes(spoiled) != marked
    assert torch.equal(jpeg_crop.decode_crop(bytes(spoiled), top, left, h, w), whole[:, top : top + h, left : left + w])
    with pytest.raises(jpeg_crop.JpegError):  # the spoiled intervals are corrupt data
        jpeg_crop.decode_crop(bytes(spoiled), 0, 0, 375, 500)


def test_corrupt_data_and_a_crop_outside_the_image_are_refused(tmp_path):
    jpeg = photo(tmp_path / "photo.jpg")
    with pytest.raises(ValueError, match=r"crop 10x10 at \(110, 0\) is not inside the image"):
        jpeg_crop.decode_crop(jpeg, 110, 0, 10, 10)
    with pytest.raises(jpeg_crop.JpegError, match="Not a JPEG file"):
        jpeg_crop.decode_crop(b"GIF89a" + jpeg[6:], 0, 0, 4, 4)
    with pytest.raises(jpeg_crop.JpegError, match="Premature end"):  # libjpeg would fill the rest with grey
        jpeg_crop.decode_crop(jpeg[: len(jpeg) // 2], 0, 0, 117, 203)


def test_the_crop_is_drawn_as_torchvision_draws_it():
    """Same seed, same crop as torchvision's RandomResizedCrop (the PIL loader's), including the centre-crop
    fallback of images too narrow or too wide for any try to fit."""
    for width, height in [(500, 375), (375, 500), (64, 64), (3, 400), (900, 2), (1, 1)]:
        for seed in range(30):
            torch.manual_seed(seed)
            ours = data.crop_box(width, height, (0.08, 1.0))
            torch.manual_seed(seed)
            theirs = transforms.RandomResizedCrop.get_params(torch.empty(3, height, width), [0.08, 1.0], [3 / 4, 4 / 3])
            assert ours == tuple(theirs), (width, height, seed)


@pytest.mark.parametrize("restarts", [False, True])
def test_the_fast_loader_trains_on_the_crop_a_whole_decode_would_give(tmp_path, restarts):
    """load(path) decodes only the crop (of a rewritten JPEG: only its intervals); __call__ crops a whole decode:
    with one seed, the same tensor."""
    path = tmp_path / "photo.jpg"
    jpeg = photo(path, 500, 375)
    if restarts:
        path.write_bytes(jpeg_crop.add_restarts(jpeg))
    augment = data.CropFirst(64, 0.08, hflip=True)
    for seed in range(10):
        torch.manual_seed(seed)
        partial = augment.load(str(path))
        torch.manual_seed(seed)
        assert torch.equal(partial, augment(data.read_uint8(str(path)))) and partial.shape == (3, 64, 64)


def test_a_jpeg_header_claiming_too_many_pixels_is_refused_by_name_before_any_decoding(tmp_path, monkeypatch):
    """The fast loader reads the size from the JPEG's header itself: past PIL's limit the file goes to PIL, which
    refuses it as a decompression bomb, as the pil loader does; the partial decoder never sees it."""

    def never(*_):
        raise AssertionError("decoded a decompression bomb")

    monkeypatch.setattr(jpeg_crop, "decode_crop", never)
    jpeg = bytearray(photo(tmp_path / "small.jpg", 16, 16))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 9] = (20000).to_bytes(2, "big") * 2
    bomb = tmp_path / "bomb.jpg"
    bomb.write_bytes(bytes(jpeg))
    assert jpeg_crop.info(bytes(jpeg)) == (20000, 20000, 3)
    with pytest.raises(UsageError, match=f"image {re.escape(str(bomb))} has 400000000 pixels, more than the "):
        data.CropFirst(8, 0.5, hflip=False).load(str(bomb))


def test_without_a_compiler_the_fast_loader_decodes_whole_images_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv(jpeg_crop.DIR, str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "/bin/false")
    jpeg_crop._load.cache_clear()
    try:
        assert jpeg_crop.library() is None
        assert re.match(r"/bin/false could not build jpeg_crop.c", jpeg_crop.unavailable())
        path = tmp_path / "photo.jpg"
        photo(path, 500, 375)
        torch.manual_seed(0)
        whole = data.CropFirst(32, 0.5, hflip=False).load(str(path))
        assert whole.shape == (3, 32, 32) and not list((tmp_path / "cache").glob("*.so"))
    finally:
        jpeg_crop._load.cache_clear()


def test_images_partial_decoding_does_not_take_are_decoded_whole(tmp_path):
    """PNGs, CMYK JPEGs and JPEGs cut short (no end marker) are decoded whole (read_uint8): cropped alike, or named
    when broken, whichever crop is drawn."""
    augment = data.CropFirst(8, 0.5, hflip=True)
    for path in (write_image(tmp_path / "a.png"), write_image(tmp_path / "c.jpg", "CMYK", fmt="JPEG")):
        assert augment.load(str(path)).shape == (3, 8, 8)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(photo(tmp_path / "photo.jpg", 500, 375)[:3000])
    for seed in range(5):
        torch.manual_seed(seed)
        with pytest.raises(UsageError, match=f"cannot decode image {re.escape(str(cut))}"):
            augment.load(str(cut))


def test_the_c_file_names_the_flags_it_is_built_with():
    """The library is named by the C file's digest: the flags written in it make a change of them a new library."""
    assert " ".join(jpeg_crop.FLAGS) in jpeg_crop.SOURCE.read_text()
