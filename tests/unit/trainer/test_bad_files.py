"""Images that cannot be decoded: every one found in one pass, refused in one line that names a list of them all,
or left out; the check of a data version (.verified.json) read and refused when it is not one."""

import json
from pathlib import Path

import pytest

from nodelib import image_files, verified
from nodelib.errors import UsageError
from tests.fakes.image_files import write_image, write_png_header
from trainer import data


def corrupt_files(folder: Path) -> dict[str, str]:
    """Corrupt images of several kinds under `folder`, by name, with a word their reason holds."""
    truncated = write_image(folder / "truncated.jpg", fmt="JPEG", size=64)
    truncated.write_bytes(truncated.read_bytes()[:200])
    (folder / "empty.png").write_bytes(b"")
    (folder / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    (folder / "text.jpeg").write_bytes(b"hello, I am not a JPEG")
    write_png_header(folder / "bomb.png", 20000, 20000)
    return {
        "truncated.jpg": "",
        "empty.png": "cannot identify image file",
        "garbage.png": "",
        "text.jpeg": "cannot identify image file",
        "bomb.png": "400000000 pixels, more than the",
    }


@pytest.fixture
def mixed(tmp_path) -> tuple[list[str], dict[str, str]]:
    """Good PNGs and JPEGs (RGB, grayscale, CMYK) with corrupt files among them: every path, and the bad ones."""
    folder = tmp_path / "images"
    good = [write_image(folder / f"ok{i}.png") for i in range(6)]
    good += [
        write_image(folder / "ok.jpg", fmt="JPEG", size=64),
        write_image(folder / "gray.jpg", "L", fmt="JPEG"),
        write_image(folder / "cmyk.jpg", "CMYK", fmt="JPEG"),
    ]
    bad = corrupt_files(folder)
    paths = sorted(str(p) for p in good) + [str(folder / name) for name in bad]
    return paths, bad


def test_every_bad_image_is_found_with_its_reason_in_the_order_given(mixed):
    paths, bad = mixed
    found = image_files.find_bad_images(paths)
    assert [Path(path).name for path, _ in found] == list(bad)
    for (path, why), word in zip(found, bad.values()):
        assert why and word in why and "\n" not in why and path not in why  # the path is beside it, not in it


def test_a_header_check_finds_what_is_no_image_at_all(mixed):
    paths, _ = mixed
    found = {Path(path).name for path, _ in image_files.find_bad_images(paths, decode=False)}
    assert {"empty.png", "garbage.png", "text.jpeg", "bomb.png"} <= found and "ok.jpg" not in found


def test_the_error_is_one_line_naming_the_count_the_first_and_the_list(tmp_path):
    bad = [(f"train/a/x{i}.JPEG", "cannot identify image file") for i in range(500)]
    listing = image_files.write_bad_list(bad, tmp_path / "out" / "bad-files.tsv")
    message = str(image_files.bad_images_error(bad, 1331167, listing, "/data/imagenet"))
    assert message == (
        "500 of 1331167 images in /data/imagenet cannot be decoded (first: train/a/x0.JPEG: cannot "
        f"identify image file); all 500 are listed in {listing}; replace or remove them, or pass "
        "--bad-files skip (training.bad_files: skip) to train without them"
    )
    assert image_files.read_bad_list(listing) == bad
    assert listing.read_text().count("\n") == 500 and all(
        line.count("\t") == 1 for line in listing.read_text().splitlines()
    )


def test_one_bad_image_is_named_in_the_line_without_a_list(tmp_path):
    message = str(image_files.bad_images_error([("train/a/bad.png", "broken\nPNG file")], 8, None, "DATA"))
    assert message == (
        "1 of 8 images in DATA cannot be decoded (train/a/bad.png: broken PNG file); replace or remove "
        "it, or pass --bad-files skip (training.bad_files: skip) to train without it"
    )


def test_a_multi_line_reason_stays_one_field_of_one_line(tmp_path):
    listing = image_files.write_bad_list([("a.png", "line one\nline\ttwo")], tmp_path / "bad.tsv")
    assert listing.read_text() == "a.png\tline one line two\n"
    assert image_files.bad_image_lines([("a.png", "x")] * 25)[-1] == "... and 5 more"


def test_a_verified_version_round_trips(tmp_path):
    bad = [("train/a/broken.jpg", "image file is truncated"), ("val/b/empty.png", "cannot identify image file")]
    path = verified.write_verified(tmp_path, "v-1234", 1331167, bad)
    assert path == tmp_path / ".verified.json" and not list(tmp_path.glob("*.partial"))
    assert json.loads(path.read_text()) == {
        "format": 1,
        "version": "v-1234",
        "files": 1331167,
        "check": "decode",
        "bad": [list(pair) for pair in bad],
    }
    assert verified.read_verified(tmp_path) == verified.Verified("v-1234", 1331167, "decode", bad)
    assert verified.read_verified(tmp_path / "elsewhere") is None


GOOD = {"format": 1, "version": "v1", "files": 3, "check": "decode", "bad": []}


@pytest.mark.parametrize(
    "text, why",
    [
        ("{not json", "not readable JSON"),
        ("[1, 2]", '"format": 1'),
        (json.dumps({**GOOD, "format": 2}), '"format": 1'),
        (json.dumps({**GOOD, "version": ""}), '"version" must name the data version'),
        (json.dumps({**GOOD, "files": "3"}), '"files" must be the number of images checked'),
        (json.dumps({**GOOD, "files": -1}), '"files" must be the number'),
        (json.dumps({**GOOD, "check": "header"}), '"check" must be "decode"'),
        (json.dumps({**GOOD, "bad": [["a.png"]]}), '"bad" must be a list of \\[path relative'),
        (json.dumps({**GOOD, "bad": [["/abs/a.png", "x"]]}), '"bad" must be a list'),
        (json.dumps({**GOOD, "bad": [["../a.png", "x"]]}), '"bad" must be a list'),
    ],
)
def test_an_invalid_verified_file_is_an_error_naming_it(tmp_path, text, why):
    (tmp_path / ".verified.json").write_text(text)
    with pytest.raises(UsageError, match=why) as refused:
        verified.read_verified(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / '.verified.json'} is not a valid verification record (")
    assert message.endswith("delete it to decode the images again, or sync the data version again")
    assert "\n" not in message


def two_classes(root: Path) -> Path:
    """train/{a,b} with 3 good images each, one corrupt file in train/a and one in val/b."""
    for name in "ab":
        for i in range(3):
            write_image(root / "train" / name / f"ok{i}.png")
        write_image(root / "val" / name / "v.png")
    (root / "train" / "a" / "bad.png").write_bytes(b"junk")
    (root / "val" / "b" / "bad.png").write_bytes(b"junk")
    return root


def test_a_verified_version_is_trusted_and_nothing_is_decoded(tmp_path):
    root = two_classes(tmp_path / "data")
    verified.write_verified(root, "v7", 10, [("train/a/bad.png", "said the sync")])  # val/b/bad.png vouched for
    train, val = data.index_folder(root)
    paths = [p for p, _ in train.samples + val.samples]
    record, source = data.known_bad_images(root, tmp_path / "out", paths, decode=True)
    assert record.bad == [("train/a/bad.png", "said the sync")] and "v7" in source
    train, val = data.skip_bad_images((train, val), root, record.bad)
    assert len(train.samples) == 6 and len(val.samples) == 3 and train.classes == ["a", "b"]
    (root / "train" / "a" / "bad.png").unlink()  # removed since the check: nothing left to refuse or skip
    paths = [p for p, _ in sum((split.samples for split in data.index_folder(root)), [])]
    assert data.known_bad_images(root, tmp_path / "out", paths, decode=True)[0].bad == []


def test_an_unverified_folder_is_decoded_in_shares_and_the_preflight_hands_its_list_on(tmp_path):
    root, out = two_classes(tmp_path / "data"), tmp_path / "out"
    train, val = data.index_folder(root)
    paths = [p for p, _ in train.samples + val.samples]
    shares = [data.known_bad_images(root, out, paths, True, rank, 3, lambda mine: [mine])[0].bad for rank in range(3)]
    assert sorted(pair[0] for share in shares for pair in share) == ["train/a/bad.png", "val/b/bad.png"]
    record, source = data.known_bad_images(root, out, paths, decode=True)
    assert source == data.DECODED and [p for p, _ in record.bad] == ["train/a/bad.png", "val/b/bad.png"]
    assert data.known_bad_images(root, out, paths, decode=False)[0] is None  # nothing decoded, nothing handed on
    data.hand_to_workers(out, record)
    handed, source = data.known_bad_images(root, out, paths, decode=False)
    assert handed == record and str(out / data.CHECKED) in source
    assert data.known_bad_images(root, out, paths[:-1], decode=False)[0] is None  # another folder's check: ignored
    data.hand_to_workers(out, verified.Verified(record.version, record.files, "decode", []))
    assert not (out / data.CHECKED).exists()
