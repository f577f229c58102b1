"""Bad data found by a worker mid-run: the rank and the file. (Bad data found before the run: tests/bad_inputs.py.)"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bad_inputs import images
from tests.conftest import write_png_header

pytestmark = pytest.mark.integration
TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
QUICK = ["--model", "resnet18", "--epochs", "1", "--workers", "2", "--batch-size", "1"]


def with_bombs(root: Path) -> Path:
    """A two-class data folder whose class a holds three images too large to decode."""
    images(root)
    for i in range(3):  # whatever the shuffle, some worker's first batch holds a bomb
        write_png_header(root / "train" / "a" / f"huge{i}.png", 20000, 20000)
    return root


def test_a_bomb_found_by_a_worker_names_the_rank_and_the_file(tmp_path):
    data = with_bombs(tmp_path / "data")
    config = tmp_path / "c.yaml"
    config.write_text("training: {preflight_images: false, image_size: 16, loader_workers: 1}\n")
    result = subprocess.run([TRAINFLOW, "train", "--config", str(config), *QUICK[:-1], "2", "--data", str(data),
                             "--workdir", str(tmp_path / "w")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert re.search(r"rank \d failed: image .*/train/a/huge\d?.png has 400000000 pixels", result.stderr), result.stderr
