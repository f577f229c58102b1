"""Images shrunk once at staging (infra/data/shrink.py): each kind of JPEG re-encoded right, everything else left,
and the mirror kept incrementally without touching the user's folder."""

import hashlib
import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from infra.data.shrink import check_max_side, out_of_date, shrink_image, shrink_jpeg, shrunk_copy, stale_files
from trainer import jpeg_crop


def jpeg(size: tuple[int, int], mode: str = "RGB", seed: int = 0, **save) -> bytes:
    """A JPEG of smooth random colours (a photo's spectrum, roughly) of `size` and `mode`."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(size, Image.Resampling.BICUBIC)
    out = io.BytesIO()
    small.convert(mode).save(out, "JPEG", quality=85, **save)
    return out.getvalue()


def opened(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def test_a_big_jpeg_is_shrunk_to_max_side_aspect_kept_with_a_restart_marker_per_mcu():
    original = jpeg((1200, 800))
    shrunk = shrink_jpeg(original, 300)
    assert shrunk is not None and len(shrunk) < len(original)
    img = opened(shrunk)
    assert (img.format, img.mode, img.size) == ("JPEG", "RGB", (300, 200))
    assert jpeg_crop.cuttable(shrunk) and not jpeg_crop.cuttable(original)  # the fast loader cuts its crops
    assert shrink_jpeg(original, 300) == shrunk  # the same bytes every time: the data version holds
    # the same picture: the original brought to that size is close to the shrunk one
    reference = np.asarray(opened(original).resize((300, 200), Image.Resampling.LANCZOS), dtype=float)
    assert np.abs(np.asarray(img, dtype=float) - reference).mean() < 3


@pytest.mark.parametrize("size", [(300, 200), (200, 300), (120, 80)])
def test_a_jpeg_within_max_side_needs_no_change(size):
    assert shrink_jpeg(jpeg(size), 300) is None


def test_what_is_not_a_decodable_jpeg_needs_no_change():
    png = io.BytesIO()
    Image.new("RGB", (900, 900)).save(png, "PNG")
    big = jpeg((900, 600))
    for data in (png.getvalue(), big[: len(big) // 2], b"\xff\xd8\xff" + b"\x00" * 100, b""):
        assert shrink_jpeg(data, 300) is None


def test_a_big_png_is_shrunk_as_a_png_its_transparency_kept_and_a_small_one_needs_no_change():
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (1080, 1920, 4), dtype=np.uint8)  # a screenshot's size, with an alpha channel
    png = io.BytesIO()
    Image.fromarray(pixels, "RGBA").save(png, "PNG")
    shrunk = shrink_image(png.getvalue(), 500)
    assert shrunk is not None
    img = opened(shrunk)
    assert (img.format, img.mode, img.size) == ("PNG", "RGBA", (500, 281))
    assert shrink_image(shrunk, 500) is None and shrink_image(png.getvalue(), 1920) is None
    palette = io.BytesIO()
    Image.new("P", (900, 600)).save(palette, "PNG")
    assert opened(shrink_image(palette.getvalue(), 300)).mode == "RGB"
    assert shrink_image(jpeg((900, 600)), 300) == shrink_jpeg(jpeg((900, 600)), 300)  # a JPEG as ever


def test_a_photo_tagged_as_turned_is_shrunk_as_stored_with_its_tag_kept_as_the_loaders_read_it():
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, shown rotated 90 degrees clockwise: a portrait
    original = jpeg((1200, 800), exif=exif.tobytes())
    shrunk = shrink_jpeg(original, 300)
    assert shrunk is not None
    img = opened(shrunk)
    assert img.size == (300, 200) and img.getexif().get(0x0112) == 6  # no loader turns it; a viewer still does
    reference = np.asarray(opened(original).resize((300, 200), Image.Resampling.LANCZOS), dtype=float)
    assert np.abs(np.asarray(img, dtype=float) - reference).mean() < 3  # the stored pixels, not turned


def test_cmyk_becomes_rgb_and_gray_stays_gray_with_its_icc_profile():
    cmyk = shrink_jpeg(jpeg((800, 600), "CMYK"), 200)
    assert cmyk is not None and opened(cmyk).mode == "RGB" and opened(cmyk).size == (200, 150)
    icc = b"\x00" * 16 + b"GRAY" + b"\x00" * 108  # only its bytes matter here: carried as they are
    gray = shrink_jpeg(jpeg((600, 800), "L", icc_profile=icc), 200)
    assert gray is not None
    img = opened(gray)
    assert (img.mode, img.size, img.info.get("icc_profile")) == ("L", (150, 200), icc)
    assert jpeg_crop.cuttable(gray)


@pytest.mark.parametrize("value", [0, 31, -500, 32.0, "500", True, None])
def test_max_side_must_be_a_whole_number_of_at_least_32(value):
    with pytest.raises(ValueError, match="at least 32"):
        check_max_side(value)
    assert check_max_side(32) == 32


def digest(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under `folder`: its SHA-256 and mtime."""
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def data(tmp_path) -> Path:
    """Two big JPEGs, a small one, a PNG and a text file, in two folders."""
    root = tmp_path / "user data"
    for rel, content in {
        "train/a/big.jpg": jpeg((640, 480), seed=1),
        "train/a/small.jpg": jpeg((100, 80), seed=2),
        "train/b/big.JPEG": jpeg((480, 640), seed=3),
        "val/a/notes.txt": b"not an image",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    Image.new("RGB", (900, 900)).save(root / "train/b/wide.png")
    return root


def test_the_mirror_shrinks_big_jpegs_links_the_rest_and_leaves_the_user_folder_as_it_was(data, tmp_path):
    before = digest(data)
    mirror = tmp_path / "work" / "shrunk" / "set-200"
    done = shrunk_copy(data, mirror, 200, workers=2, progress=False)
    assert (done["files"], done["shrunk"], done["linked"], done["unchanged"]) == (5, 3, 2, 0)
    assert digest(data) == before  # the user's folder: the same bytes and mtimes
    assert opened((mirror / "train/a/big.jpg").read_bytes()).size == (200, 150)
    assert opened((mirror / "train/b/big.JPEG").read_bytes()).size == (150, 200)
    wide = opened((mirror / "train/b/wide.png").read_bytes())
    assert (wide.format, wide.size) == ("PNG", (200, 200))  # a PNG still, under its own name
    for rel in ("train/a/small.jpg", "val/a/notes.txt"):
        assert (mirror / rel).stat().st_ino == (data / rel).stat().st_ino  # hard links, no copies
    mirrored = digest(mirror)
    assert {rel: mtime for rel, (_, mtime) in mirrored.items()} == {rel: m for rel, (_, m) in before.items()}
    assert done["bytes_mirror"] < done["bytes_source"]


def test_an_unchanged_rerun_writes_nothing_and_a_changed_or_removed_source_follows(data, tmp_path):
    mirror = tmp_path / "mirror"
    shrunk_copy(data, mirror, 200, progress=False)
    first = {p: p.stat().st_ino for p in mirror.rglob("*") if p.is_file()}
    again = shrunk_copy(data, mirror, 200, progress=False)
    assert (again["unchanged"], again["shrunk"], again["linked"], again["removed"]) == (5, 0, 0, 0)
    assert {p: p.stat().st_ino for p in mirror.rglob("*") if p.is_file()} == first  # not one file rewritten
    assert out_of_date(data, mirror, 200, ["train/a/big.jpg", "train/a/small.jpg"]) == (0, 2)

    (data / "train/a/small.jpg").write_bytes(jpeg((900, 300), seed=4))  # now big
    (data / "train/b/big.JPEG").unlink()
    assert out_of_date(data, mirror, 200, ["train/a/big.jpg", "train/a/small.jpg"]) == (1, 2)
    assert list(stale_files(data, mirror)) == [mirror / "train/b/big.JPEG"]
    third = shrunk_copy(data, mirror, 200, progress=False)
    assert (third["shrunk"], third["unchanged"], third["removed"]) == (1, 3, 1)
    assert opened((mirror / "train/a/small.jpg").read_bytes()).size == (200, 67)
    assert not (mirror / "train/b/big.JPEG").exists()


def test_a_file_a_killed_run_left_half_written_is_removed_and_never_taken_for_a_copy(data, tmp_path):
    mirror = tmp_path / "mirror"
    (mirror / "train/a").mkdir(parents=True)
    leftover = mirror / "train/a" / ".big.jpg.abc.shrink-tmp"
    leftover.write_bytes(b"half")
    done = shrunk_copy(data, mirror, 200, paths=["train/a/big.jpg"], progress=False)
    assert done["shrunk"] == 1 and not leftover.exists()


def test_the_mirror_cannot_hold_the_user_folder_and_is_not_mirrored_into_itself(data):
    for mirror in (data, data.parent):
        with pytest.raises(ValueError, match="cannot be the data folder"):
            shrunk_copy(data, mirror, 200, progress=False)
    inside = data / ".trainflow" / "shrunk" / "set-200"  # a work folder inside the data folder
    done = shrunk_copy(data, inside, 200, progress=False)
    again = shrunk_copy(data, inside, 200, progress=False)
    assert done["files"] == again["files"] == again["unchanged"] == 5


def test_a_file_that_cannot_be_hard_linked_is_copied_with_its_mtime(data, tmp_path, monkeypatch):
    def refuse(src, dst, *args, **kwargs):
        raise OSError(18, os.strerror(18))  # EXDEV: another file system

    monkeypatch.setattr(os, "link", refuse)
    mirror = tmp_path / "mirror"
    done = shrunk_copy(data, mirror, 200, workers=1, progress=False)
    assert (done["copied"], done["linked"]) == (2, 0)  # the small JPEG and the text file (the PNG is shrunk)
    small = mirror / "train/a/small.jpg"
    assert small.read_bytes() == (data / "train/a/small.jpg").read_bytes()
    assert small.stat().st_ino != (data / "train/a/small.jpg").stat().st_ino
    assert small.stat().st_mtime_ns == (data / "train/a/small.jpg").stat().st_mtime_ns
