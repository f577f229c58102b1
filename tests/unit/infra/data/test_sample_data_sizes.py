"""Photo-like JPEGs of ImageNet's sizes (write_photo_sized): their longer sides follow the stated distribution at any
count and seed, the same seed gives the same bytes, and the files are valid JPEGs of ImageNet's average weight."""

import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from infra.core.errors import BadInput
from infra.data.photos import ASPECTS, LONGER_SIDES, PHOTO_QUALITY, photo_sizes
from infra.data.sample_data import write_photo_sized


def band(longer: int) -> str:
    """Where a longer side falls: below 500, at 500, above."""
    return "smaller" if longer < 500 else "500" if longer == 500 else "larger"


@pytest.mark.parametrize(("files", "seed"), [(1000, 0), (1000, 7), (333, 1)])
def test_the_longer_sides_hold_the_stated_shares_at_any_count_and_seed(files, seed):
    sizes = photo_sizes(files, seed)
    longer = [max(size) for size in sizes]
    shares = Counter(band(side) for side in longer)
    for (share, low, high), name in zip(LONGER_SIDES, ("smaller", "500", "larger"), strict=True):
        assert abs(shares[name] - share * files) <= 1  # evenly spaced quantiles: each share to a file
        assert all(low <= side <= high for side in longer if band(side) == name)
    assert min(longer) >= 150 and 2000 < max(longer) <= 3000  # a tail up to a few thousand px
    # about 440x375 on average; the shorter side from the stated aspects, a fifth of them portrait
    assert 430 < np.mean([w for w, _ in sizes]) < 460 and 360 < np.mean([h for _, h in sizes]) < 390
    aspects = {round(min(size) / max(size), 2) for size in sizes if max(size) == 500}
    assert aspects == {round(aspect, 2) for _, aspect in ASPECTS} == {0.75, 0.67, 1.0, 0.56}
    assert 0.15 < np.mean([h > w for w, h in sizes]) < 0.25


def test_the_same_seed_draws_the_same_sizes_and_another_seed_another_order():
    assert photo_sizes(200, 3) == photo_sizes(200, 3)
    assert photo_sizes(200, 3) != photo_sizes(200, 4)
    assert sorted(max(s) for s in photo_sizes(200, 3)) == sorted(max(s) for s in photo_sizes(200, 4))


def digest(folder: Path) -> dict[str, str]:
    """Each file's path under `folder` and the hash of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*.JPEG"))
    }


def test_the_files_are_valid_jpegs_of_the_drawn_sizes_weighing_what_imagenet_s_do(tmp_path):
    folder = write_photo_sized(tmp_path / "photos", files=100, classes=4, seed=0, val_files=8)
    train = sorted((folder / "train").rglob("*.JPEG"), key=lambda p: p.name)
    assert len(train) == 100 and len({p.parent.name for p in train}) == 4
    assert len(list((folder / "val").rglob("*.JPEG"))) == 8
    drawn = photo_sizes(108, 0)
    for number, path in enumerate(train):
        with Image.open(path) as image:
            image.load()  # decodes whole: a valid JPEG, not only a valid header
            assert (image.format, image.mode, image.size) == ("JPEG", "RGB", drawn[number])
    # ImageNet-1k's training set: 1,281,167 files in 138 GB, ~108 KB a file
    assert 100_000 < np.mean([p.stat().st_size for p in train]) < 125_000
    reference = tmp_path / "q90.jpg"
    Image.new("RGB", (16, 16)).save(reference, quality=90)
    with Image.open(train[0]) as image, Image.open(reference) as at_90:  # quality 90: its quantisation tables
        assert image.quantization == at_90.quantization and PHOTO_QUALITY == 90


def test_the_same_seed_writes_the_same_bytes_in_one_process_or_several(tmp_path):
    one = write_photo_sized(tmp_path / "one", files=12, classes=3, seed=5, workers=1)
    two = write_photo_sized(tmp_path / "two", files=12, classes=3, seed=5, workers=2)
    other = write_photo_sized(tmp_path / "other", files=12, classes=3, seed=6, workers=1)
    assert digest(one) == digest(two) and len(digest(one)) == 12
    assert digest(other) != digest(one)


def test_a_set_is_written_whole_once_and_kept(tmp_path):
    dest = write_photo_sized(tmp_path / "photos", files=3, classes=2)
    before = digest(dest)
    assert [p.name for p in tmp_path.iterdir()] == ["photos"]  # no temporary sibling left
    assert write_photo_sized(dest, files=3, classes=2, seed=9) == dest and digest(dest) == before


@pytest.mark.parametrize(
    ("files", "classes", "val_files"), [(0, 2, 0), (4, 0, 0), (4, 2, -1)], ids=["no files", "no classes", "val"]
)
def test_an_impossible_set_is_refused_naming_the_numbers(tmp_path, files, classes, val_files):
    with pytest.raises(BadInput, match=f"files={files}, classes={classes}, val_files={val_files}"):
        write_photo_sized(tmp_path / "photos", files=files, classes=classes, val_files=val_files)
    assert not (tmp_path / "photos").exists()
