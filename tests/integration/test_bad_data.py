"""Bad data as `trainflow train` meets it: one line naming the file and the fix, exit status 2, and no results
folder left behind; or, found by a worker mid-run, the rank and the file."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_image
from tests.unit.test_data import write_png_header

pytestmark = pytest.mark.integration
TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
QUICK = ["--model", "resnet18", "--epochs", "1", "--workers", "2", "--batch-size", "1"]


def two_classes(root: Path) -> Path:
    for rel in ("train/a/ok0.png", "train/a/ok1.png", "train/b/ok2.png", "train/b/ok3.png"):
        write_image(root / rel)
    return root


def make(root: Path, case: str) -> Path:
    """A two-class data folder with one problem (or, for "file", a file in its place)."""
    if case == "file":
        return write_image(root.with_suffix(".png"))
    two_classes(root)
    if case == "bomb":
        write_png_header(root / "train" / "a" / "huge.png", 20000, 20000)
    elif case == "big":
        write_png_header(root / "train" / "b" / "big.png", 10000, 10000)
    elif case == "loop":
        os.symlink("../..", root / "train" / "a" / "up")
    elif case == "broken":
        os.symlink("nowhere.png", root / "train" / "b" / "gone.png")
    elif case == "newline":
        write_image(root / "train" / "a" / "two\nlines.png")
    elif case == "tab":
        write_image(root / "train" / "c\td" / "x.png")
    elif case == "one class":
        (root / "train" / "b").rename(root / "val")
        (root / "val").rename(root / "train" / "a" / "nested")
    return root


@pytest.mark.parametrize("case, message", [
    ("bomb", r"image .*/train/a/huge.png has 400000000 pixels, more than the 89478485 that decoding allows \(a guard "
             r"against decompression bombs\); shrink it or remove the file$"),
    ("big", r"image .*/train/b/big.png has 100000000 pixels, more than the 89478485"),
    ("loop", r".*/train/a/up is a symlink loop \(it points to \.\./\.\., a folder that holds it\); remove the link$"),
    ("broken", r".*/train/b/gone.png is a broken symlink \(its target nowhere.png does not exist\); restore the target"),
    ("newline", r"'.*/train/a/two\\nlines.png' has a control character \('\\n'\) in its name; rename it"),
    ("tab", r"'.*/train/c\\td' has a control character \('\\t'\) in its name; rename it"),
    ("one class", r"data folder .* has 1 class \(a\) under train/; a classifier needs at least 2: add another "
                  r"train/<class>/ folder of images$"),
    ("file", r"data folder .*/data.png is a file, not a folder; point --data at a folder holding train/<class>/"),
])
def test_bad_data_is_refused_in_one_line_and_leaves_no_results_folder(tmp_path, case, message):
    data, work = make(tmp_path / "data", case), tmp_path / "work"
    result = subprocess.run([TRAINFLOW, "train", *QUICK, "--data", str(data), "--workdir", str(work)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(f"^error: {message}", lines[0]), result.stderr
    assert not (work / "results").exists()


def test_a_bomb_found_by_a_worker_names_the_rank_and_the_file(tmp_path):
    data = make(tmp_path / "data", "bomb")
    for i in (1, 2):  # whatever the shuffle, some worker's first batch holds a bomb
        write_png_header(data / "train" / "a" / f"huge{i}.png", 20000, 20000)
    config = tmp_path / "c.yaml"
    config.write_text("training: {preflight_images: false, image_size: 16, loader_workers: 1}\n")
    result = subprocess.run([TRAINFLOW, "train", "--config", str(config), *QUICK[:-1], "2", "--data", str(data),
                             "--workdir", str(tmp_path / "w")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert re.search(r"rank \d failed: image .*/train/a/huge\d?.png has 400000000 pixels", result.stderr), result.stderr
