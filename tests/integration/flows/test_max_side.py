"""`trainflow stage --max-side N` end to end against a real Azurite: the staged JPEGs shrunk, the user's folder
untouched, an unchanged re-run moving nothing and another N staging again; and the dry run saying what it would do."""

import hashlib
import io
import json
import os
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from infra.services.azurite import ACCOUNT
from nodelib.staged.names import MANIFEST
from tests.integration.cli.test_stage_cli import TRAINFLOW, sas_token
from tests.integration.infra import test_disk_space

pytestmark = pytest.mark.integration
TRAINING = (
    "training:\n  model: resnet18\n  image_size: 32\n  epochs: 1\n  batch_size: 2\n  workers: 1\n  loader_workers: 0\n"
)
mounted_tmpfs = test_disk_space.tmpfs  # the fixture: mount(size) -> a fresh small tmpfs disk


@pytest.fixture
def photos(tmp_path) -> Path:
    """Two classes of JPEGs, 160x120 and 60x45, and a PNG: train/ and val/."""
    rng = np.random.default_rng(0)
    root = tmp_path / "my photos"
    for i in range(12):
        split, size = ("val" if i % 4 == 3 else "train"), ((160, 120) if i % 2 else (60, 45))
        folder = root / split / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (3, 4, 3), dtype=np.uint8)
        Image.fromarray(pixels).resize(size, Image.Resampling.BICUBIC).save(folder / f"{i}.jpg", quality=90)
    Image.new("RGB", (200, 200), "teal").save(root / "train" / "c0" / "flat.png")
    return root


def tree(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file: its SHA-256 and mtime."""
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def trainflow(tmp_path: Path, port: int, *args: str) -> subprocess.CompletedProcess:
    config = tmp_path / "azure.yaml"
    if not config.exists():
        config.write_text(
            f"storage:\n  backend: azure\n  account_url: http://127.0.0.1:{port}/{ACCOUNT}\n"
            f"  auth: sas\n  container: c-{uuid.uuid4().hex[:10]}\n{TRAINING}"
        )
    return subprocess.run(
        [TRAINFLOW, *args, "--config", str(config), "--workdir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        env={**os.environ, "AZURE_STORAGE_SAS_TOKEN": sas_token(), "COLUMNS": "250"},
        timeout=300,
    )


def header(current: Path) -> dict:
    """The header of the file server's current manifest."""
    return json.loads((current / MANIFEST).read_text().split("\n", 1)[0])


def staged_sides(current: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(current)): Image.open(io.BytesIO(p.read_bytes())).size for p in current.rglob("*.jpg")}


def test_stage_with_max_side_shrinks_the_staged_copy_only_and_restages_only_when_n_changes(
    tmp_path, azurite_port, photos
):
    before = tree(photos)
    first = trainflow(tmp_path, azurite_port, "stage", "--data", str(photos), "--max-side", "100")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "shrunk copy (100 px): 13 files (7 shrunk, 6 linked)" in first.stdout  # the PNG too
    current = tmp_path / "work" / "fileserver" / "datasets" / "my-photos" / "current"
    sides = staged_sides(current)
    assert len(sides) == 12 and set(sides.values()) == {(100, 75), (60, 45)}
    assert Image.open(current / "train" / "c0" / "flat.png").size == (100, 100)
    assert tree(photos) == before  # the user's folder: the same bytes and mtimes
    assert header(current)["max_side"] == 100
    version = current.resolve()

    again = trainflow(tmp_path, azurite_port, "stage", "--data", str(photos), "--max-side", "100")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "13 unchanged" in again.stdout and "none sent" in again.stdout  # nothing written, nothing moved
    assert current.resolve() == version and tree(photos) == before

    plan = trainflow(tmp_path, azurite_port, "run", "--data", str(photos), "--max-side", "50", "--dry-run")
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    printed = " ".join(plan.stdout.split())
    assert "(JPEGs and PNGs over 50 px re-encoded at 50): 13 of 13 files to write; then stage it" in printed
    assert not (tmp_path / "work" / "shrunk" / "my-photos-50").exists()  # the dry run wrote nothing

    other = trainflow(tmp_path, azurite_port, "stage", "--data", str(photos), "--max-side", "50")
    assert other.returncode == 0, other.stdout[-2000:] + other.stderr[-2000:]
    assert set(staged_sides(current).values()) == {(50, 38)}
    assert current.resolve() != version and header(current)["max_side"] == 50  # a new data version
    assert tree(photos) == before


def test_run_with_max_side_trains_on_the_shrunk_copy(tmp_path, azurite_port, photos):
    result = trainflow(tmp_path, azurite_port, "run", "--data", str(photos), "--max-side", "64")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "shrunk copy (64 px): 13 files (7 shrunk, 6 linked)" in result.stdout
    current = tmp_path / "work" / "fileserver" / "datasets" / "my-photos" / "current"
    assert set(staged_sides(current).values()) == {(64, 48), (60, 45)} and header(current)["max_side"] == 64


def test_a_max_side_below_32_is_refused_with_what_to_give(tmp_path, azurite_port, photos):
    result = trainflow(tmp_path, azurite_port, "stage", "--data", str(photos), "--max-side", "8")
    assert result.returncode == 2
    assert "max_side must be a whole number of pixels, at least 32" in result.stderr


def test_the_space_check_counts_the_shrunk_copy(mounted_tmpfs, photos):
    work = mounted_tmpfs("3m") / "w"
    result = subprocess.run(
        [TRAINFLOW, "stage", "--data", str(photos), "--workdir", str(work), "--max-side", "100"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "the shrunk copy (at most the originals' size)" in result.stderr and "Traceback" not in result.stderr
    assert not (work / "shrunk").exists()  # refused before anything started
