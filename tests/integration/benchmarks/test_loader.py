"""`trainflow bench loader` at its smallest: every loader, and the fast loader on JPEGs with restart markers, 1 core
and all, two rounds, the JSON."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from benchmarks.common import RESTARTS
from benchmarks.loader import installed_loaders
from infra.data.sample_data import write_photo_like

pytestmark = pytest.mark.integration
TRAINFLOW = str(Path(sys.executable).with_name("trainflow"))
FIGURE = {"median", "min", "max", "all"}


def bench_loader(tmp_path, *args) -> subprocess.CompletedProcess:
    """The command with a small batch and crop, so that 16 JPEGs make batches to time."""
    config = tmp_path / "small.yaml"
    config.write_text("training: {batch_size: 4, image_size: 64}\n")
    return subprocess.run(
        [TRAINFLOW, "bench", "loader", "--config", str(config), "--workdir", str(tmp_path / "w"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bench_loader_measures_both_loaders_on_one_core_and_all_and_writes_the_json(tmp_path):
    out = bench_loader(tmp_path, "--files", "16", "--repeats", "2", "--json", str(tmp_path / "loader.json"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "loader.json").read_text())
    cores = result["machine"]["cores"]
    assert result["images"] == 16 and result["repeats"] == 2 and result["cores"] == cores
    loaders = (*installed_loaders(), RESTARTS)
    assert set(loaders) >= {"fast", "pil"}
    assert set(result["runs"]) == {f"{loader}/{n}" for loader in loaders for n in {1, cores}}
    for figures in result["runs"].values():
        assert all(
            set(f) == FIGURE and len(f["all"]) == 2 and 0 < f["min"] <= f["median"] <= f["max"]
            for f in figures.values()
        )
    assert result["runs"][f"pil/{cores}"]["per_core"]["all"] == pytest.approx(
        [rate / cores for rate in result["runs"][f"pil/{cores}"]["images_per_sec"]["all"]]
    )
    assert set(result["speedup_per_core"]) == set(loaders) - {"pil"}
    assert all(set(ratios) == {str(n) for n in {1, cores}} for ratios in result["speedup_per_core"].values())
    for loader in loaders:  # DALI's one pipeline decodes, crops and batches: all of it counted as decode
        parts = {part: figure["median"] for part, figure in result["ms_per_image"][loader].items()}
        assert parts["decode"] > 0 and parts["augment"] > 0 and (parts["collate"] > 0) == (loader != "dali")
    assert "per core vs pil" in " ".join(out.stdout.split())
    # each figure is printed as it is measured, so a bench stopped by a time limit keeps the rounds it finished
    rate = result["runs"][f"fast/{cores}"]["images_per_sec"]["all"][1]
    assert f"fast, {cores} core{'s' * (cores > 1)}: {rate:.0f} images/s" in out.stdout
    assert "pil, ms per image on one core: decode" in out.stdout and "(2/2)" in out.stdout
    rewrite = result["restart_markers"]  # the copy the fast loader read again, rewritten once
    assert (rewrite["files"], rewrite["rewritten"], rewrite["left"]) == (16, 16, [])
    assert rewrite["ms_per_file"] > 0 and 0 < rewrite["bytes_after"] < 1.1 * rewrite["bytes_before"]
    copy = Path(rewrite["folder"])
    assert copy.parent == tmp_path / "w" / "bench" / "loader" and len(list((copy / "train").rglob("*.JPEG"))) == 16


def test_bench_loader_refuses_too_few_images_in_one_line(tmp_path):
    out = bench_loader(tmp_path, "--files", "5")
    assert out.returncode == 2
    assert out.stderr.strip().endswith(
        "has 5 training images: timing needs two batches of 4 or more (the first "
        "starts the workers); pass --files 8 or more, or lower training.batch_size"
    )


def test_the_generated_jpegs_are_shaped_and_weighted_like_imagenet_s(tmp_path):
    folder = write_photo_like(tmp_path / "photos", files=6, classes=2)
    paths = sorted((folder / "train").rglob("*.JPEG"))
    assert len(paths) == 6 and len({p.parent for p in paths}) == 2
    for path in paths:
        with Image.open(path) as image:
            assert image.size == (500, 375) and image.format == "JPEG"
        assert 90_000 < path.stat().st_size < 130_000


def test_bench_loader_refuses_a_data_folder_the_trainer_cannot_read_in_one_line(tmp_path):
    out = bench_loader(tmp_path, "--data", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (
        f"error: data folder {tmp_path / 'nowhere'} does not exist; point --data at a "
        "folder holding train/<class>/ images"
    )
