"""The ImageNet-shaped generator (`trainflow data imagenet-shaped`): ImageNet's layout and names as the trainer indexes
them, small distinct JPEGs that decode, written whole or not at all, kept when asked again, refused over other data."""

import hashlib
import os
import re
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from cli import app
from infra.core.errors import BadInput
from infra.data import sample_data
from infra.data.sample_data import ImagenetShape, write_imagenet_shaped
from nodelib.layout import index_folder

SHAPE = (3, 5, 2)  # classes, per class, val per class: 21 files


def files_of(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*.JPEG"))}


def test_the_layout_is_imagenets_and_the_trainer_indexes_it(tmp_path):
    done = write_imagenet_shaped(tmp_path / "set", *SHAPE, progress=False)
    train, val = index_folder(tmp_path / "set")
    assert train.classes == val.classes == sorted(set(train.classes)) and len(train.classes) == 3
    assert all(re.fullmatch(r"n\d{8}", wnid) for wnid in train.classes) and train.classes[0] == "n01440764"
    assert len(train.samples) == 15 and len(val.samples) == 6
    assert {label for _, label in val.samples} == {0, 1, 2}
    names = files_of(tmp_path / "set")
    assert f"train/{train.classes[1]}/{train.classes[1]}_5.JPEG" in names
    assert sorted(name.split("/")[-1] for name in names if name.startswith("val/")) == [
        f"ILSVRC2012_val_{number:08d}.JPEG" for number in range(1, 7)
    ]
    assert done == {
        "path": str(tmp_path / "set"),
        "files": 21,
        "bytes": sum(map(len, names.values())),
        "seconds": done["seconds"],
        "kept": False,
    }


def test_every_file_is_a_distinct_valid_jpeg_of_a_few_hundred_bytes_to_a_few_kb(tmp_path):
    write_imagenet_shaped(tmp_path / "set", *SHAPE, progress=False)
    files = files_of(tmp_path / "set")
    for name in files:
        with Image.open(tmp_path / "set" / name) as image:
            image.load()
            assert image.format == "JPEG" and image.mode == "RGB"
            assert image.info["comment"] == name.encode()  # the comment segment that makes it unique
    sizes = [len(data) for data in files.values()]
    assert min(sizes) >= 200 and max(sizes) <= 8 * 1024 and len(set(sizes)) >= 5
    assert len({hashlib.sha256(data).digest() for data in files.values()}) == len(files) == 21


def test_writer_processes_write_the_same_bytes_as_one_process(tmp_path):
    write_imagenet_shaped(tmp_path / "one", *SHAPE, progress=False, workers=1)
    write_imagenet_shaped(tmp_path / "two", *SHAPE, progress=False, workers=2)
    assert files_of(tmp_path / "one") == files_of(tmp_path / "two")


def test_a_second_run_keeps_the_folder_as_it_is(tmp_path):
    first = write_imagenet_shaped(tmp_path / "set", *SHAPE, progress=False)
    before = {path: path.stat().st_mtime_ns for path in (tmp_path / "set").rglob("*")}
    again = write_imagenet_shaped(tmp_path / "set", *SHAPE, progress=False)
    assert again["kept"] and (again["files"], again["bytes"]) == (first["files"], first["bytes"])
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / "set").rglob("*")} == before


def test_another_shape_or_other_data_in_the_place_is_refused_and_an_empty_folder_is_filled(tmp_path):
    write_imagenet_shaped(tmp_path / "set", *SHAPE, progress=False)
    with pytest.raises(
        BadInput,
        match=r"set holds an ImageNet-shaped set of 3x5\+2, not 3x6\+2 .*choose another "
        r"--data or delete it",
    ):
        write_imagenet_shaped(tmp_path / "set", 3, 6, 2, progress=False)
    (tmp_path / "other" / "train").mkdir(parents=True)
    with pytest.raises(BadInput, match="other exists and is not an ImageNet-shaped set written by trainflow"):
        write_imagenet_shaped(tmp_path / "other", *SHAPE, progress=False)
    (tmp_path / "empty").mkdir()
    assert write_imagenet_shaped(tmp_path / "empty", *SHAPE, progress=False)["files"] == 21


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    calls = []

    def fail_on_the_tenth(jpeg: bytes, text: bytes) -> bytes:
        calls.append(text)
        if len(calls) == 10:
            raise OSError(28, "No space left on device")
        return jpeg

    monkeypatch.setattr(sample_data, "_with_comment", fail_on_the_tenth)
    with pytest.raises(OSError, match="No space left"):
        write_imagenet_shaped(tmp_path / "set", *SHAPE, progress=False, workers=1)
    assert os.listdir(tmp_path) == []  # neither the folder nor its temporary sibling


def test_a_set_the_disk_has_no_room_for_is_refused_before_writing(tmp_path, monkeypatch):
    real = os.statvfs(tmp_path)
    small = os.statvfs_result(
        (real.f_bsize, 4096, real.f_blocks, 10, 10, real.f_files, real.f_ffree, 10**9, real.f_flag, real.f_namemax)
    )
    monkeypatch.setattr(sample_data.os, "statvfs", lambda path: small)  # 40 KB free
    with pytest.raises(BadInput, match=r"21 files need about 0.1 MB and .* has 0.0 MB free; free space there"):
        write_imagenet_shaped(tmp_path / "set", 3, 5, 2, progress=False)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "shape, option",
    [
        ((1, 5, 2), "--classes must be 2 to"),
        ((-3, 5, 2), "--classes"),
        ((3, 0, 2), "--per-class must be 1 or more"),
        ((3, 5, -1), "--val-per-class must be 0 or more"),
        ((1000, 5, 100_000), "--val-per-class must be at most 99,999"),
    ],
)
def test_a_shape_that_cannot_be_used_names_its_option(shape, option):
    with pytest.raises(BadInput, match=re.escape(option)):
        ImagenetShape(*shape).check()


def test_the_default_shape_is_imagenet_1k_with_even_classes():
    # ImageNet-1k has 1,281,167 training images, 732 to 1,300 a class; 1,281 in each is 167 fewer
    assert ImagenetShape().files == 1_331_000 and ImagenetShape().label == "1000x1281+50"


def cli(*args: str):
    return CliRunner().invoke(app, ["data", "imagenet-shaped", *args])


def test_the_command_writes_under_the_workdir_then_keeps_and_refuses(tmp_path):
    shape = ["--classes", "3", "--per-class", "5", "--val-per-class", "2"]
    dest = tmp_path / "w" / "data" / "imagenet-shaped-3x5+2"
    first = cli(*shape, "--workdir", str(tmp_path / "w"))
    assert first.exit_code == 0, first.output
    assert re.fullmatch(
        rf"wrote {re.escape(str(dest))}: 21 files, 0\.\d\d MB in [\d.]+ s \([\d,]+ files/s\)\n", first.stdout
    )
    assert len(index_folder(dest)[0].samples) == 15
    again = cli(*shape, "--workdir", str(tmp_path / "w"))
    assert again.exit_code == 0 and again.stdout.startswith(f"kept {dest}: 21 files")
    other = cli("--classes", "4", "--data", str(dest))
    assert other.exit_code == 2 and other.stderr == (
        f"error: {dest} holds an ImageNet-shaped set of 3x5+2, not "
        "4x1281+50 (classes x per class + val per class); choose "
        "another --data or delete it\n"
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (["--classes", "1"], "error: --classes must be 2 to 100,000"),
        (["--per-class", "0"], "error: --per-class must be 1 or more"),
        (["--val-per-class", "-5"], "error: --val-per-class must be 0 or more"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, line):
    result = cli(*args, "--data", str(tmp_path / "set"))
    assert result.exit_code == 2 and result.stderr.startswith(line) and result.stderr.count("\n") == 1, result.output
    assert not (tmp_path / "set").exists()
