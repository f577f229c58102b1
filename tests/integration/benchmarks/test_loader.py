"""`trainflow bench loader` at its smallest: every loader, and the fast loader on JPEGs with restart markers, on the
JPEGs and on them shrunk at 500 px, 1 core and all, two rounds, the JSON."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from benchmarks.common import RESTARTS
from benchmarks.loader import cpu_loaders

pytestmark = pytest.mark.integration
TRAINFLOW = str(Path(sys.executable).with_name("trainflow"))
FIGURE = {"median", "min", "max", "all"}


def bench_loader(tmp_path, *args) -> subprocess.CompletedProcess:
    """The command with a small batch and crop, so that a few JPEGs make batches to time."""
    config = tmp_path / "small.yaml"
    config.write_text("training: {batch_size: 4, image_size: 64}\n")
    return subprocess.run(
        [TRAINFLOW, "bench", "loader", "--config", str(config), "--workdir", str(tmp_path / "w"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bench_loader_measures_every_loader_on_the_jpegs_and_shrunk_on_one_core_and_all_and_writes_the_json(
    tmp_path,
):
    # 32 photographs of ImageNet's sizes: the largest (a 2% tail) is longer than 500 px
    out = bench_loader(tmp_path, "--files", "32", "--repeats", "2", "--json", str(tmp_path / "loader.json"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "loader.json").read_text())
    cores = result["machine"]["cores"]
    assert result["images"] == 32 and result["repeats"] == 2 and result["cores"] == cores
    originals = (*cpu_loaders(), RESTARTS)
    loaders = (*originals, *(f"{loader}@500" for loader in originals))
    assert set(originals) >= {"fast", "pil"} and "gpu" not in originals  # gpu decodes on the device: bench gpu
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
        assert (
            parts["decode"] > 0 and parts["augment"] > 0 and (parts["collate"] > 0) == (not loader.startswith("dali"))
        )
    assert "per core vs pil" in " ".join(out.stdout.split())
    # each figure is printed as it is measured, so a bench stopped by a time limit keeps the rounds it finished
    rate = result["runs"][f"fast/{cores}"]["images_per_sec"]["all"][1]
    assert f"fast, {cores} core{'s' * (cores > 1)}: {rate:.0f} images/s" in out.stdout
    assert "pil, ms per image on one core: decode" in out.stdout and "(2/2)" in out.stdout
    assert "pil@500, ms per image on one core: decode" in out.stdout
    rewrite = result["restart_markers"]  # the copy the fast loader read again, rewritten once
    assert (rewrite["files"], rewrite["rewritten"], rewrite["left"]) == (32, 32, [])
    assert rewrite["ms_per_file"] > 0 and 0 < rewrite["bytes_after"] < 1.1 * rewrite["bytes_before"]
    copy = Path(rewrite["folder"])
    assert copy.parent == tmp_path / "w" / "bench" / "loader" and len(list((copy / "train").rglob("*.JPEG"))) == 32
    check_shrunk(result, tmp_path / "w" / "bench" / "loader")
    # the headline: the fast loader on the shrunk JPEGs with restart markers against pil on the originals, per core
    assert result["headline"] == {
        "run": f"{RESTARTS}@500",
        "against": "pil",
        "per_core": result["speedup_per_core"][f"{RESTARTS}@500"],
    }
    assert f"headline, {RESTARTS}@500 against pil on the originals, per core: 1 core " in out.stdout


def check_shrunk(result: dict, under: Path) -> None:
    """The shrunk copy: the photographs longer than 500 px re-encoded at 500 (the rest linked), its time and bytes."""
    shrink, weights = result["shrink"], result["bytes"]
    assert result["max_side"] == 500 and shrink["max_side"] == 500
    copy = Path(shrink["folder"])
    assert copy.parent == under and copy.name.endswith("-max500") and "mirror" not in shrink
    shrunk = sorted((copy / "train").rglob("*.JPEG"))
    originals = {p.relative_to(Path(shrink["source"])): p for p in Path(shrink["source"]).rglob("*.JPEG")}
    assert len(shrunk) == len(originals) == 32
    longer = {}
    for path in originals.values():
        with Image.open(path) as image:
            longer[path.relative_to(Path(shrink["source"]))] = max(image.size)
    big = {rel for rel, side in longer.items() if side > 500}
    assert len(big) == 1 and (shrink["files"], shrink["shrunk"], shrink["linked"]) == (32, 1, 31)
    for path in shrunk:
        rel = path.relative_to(copy)
        with Image.open(path) as image:
            assert max(image.size) == (500 if rel in big else longer[rel])
        assert (path.stat().st_ino == originals[rel].stat().st_ino) == (rel not in big)  # linked, not copied
    assert shrink["seconds"] > 0 and shrink["ms_per_file"] > 0
    assert weights["originals"] == shrink["bytes_source"] == sum(p.stat().st_size for p in originals.values())
    assert weights["originals@500"] == shrink["bytes_mirror"] < weights["originals"]
    assert weights[RESTARTS] == result["restart_markers"]["bytes_after"]
    assert 0 < weights[f"{RESTARTS}@500"] < weights[RESTARTS]


def test_bench_loader_refuses_too_few_images_in_one_line(tmp_path):
    out = bench_loader(tmp_path, "--files", "5")
    assert out.returncode == 2
    assert out.stderr.strip().endswith(
        "has 5 training images: timing needs two batches of 4 or more (the first "
        "starts the workers); pass --files 8 or more, or lower training.batch_size"
    )


def test_bench_loader_refuses_a_data_folder_the_trainer_cannot_read_in_one_line(tmp_path):
    out = bench_loader(tmp_path, "--data", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (
        f"error: data folder {tmp_path / 'nowhere'} does not exist; point --data at a "
        "folder holding train/<class>/ images"
    )
