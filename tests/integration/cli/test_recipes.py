"""`trainflow run --data DIR` without a config file, as a user runs it: the recipe picked from the images, said in the
dry run's first line with its reason and used in the plan; a config file's 32 px on photographs warned about."""

import os
import subprocess
from pathlib import Path

import pytest

from infra.data.sample_data import write_photo_sized
from tests.fakes.image_files import write_image
from tests.fakes.paths import BIN

pytestmark = pytest.mark.integration  # the command as a user runs it


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """16 photo-like JPEGs in 2 classes, sized as ImageNet's photographs (a run on them needs a batch of 8 or less)."""
    return write_photo_sized(tmp_path_factory.mktemp("data") / "my-photos", files=16, classes=2, workers=1)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """64 PNGs of 32x32 px in 2 classes, sized as the digits set's: one global batch of the digits recipe."""
    root = tmp_path_factory.mktemp("data") / "my-digits"
    for i in range(64):
        write_image(root / "train" / "ab"[i % 2] / f"{i}.png", size=32)
    return root


def dry_run(tmp_path: Path, data: Path, *more: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`trainflow run --data DATA --dry-run` with `env` added, its table unwrapped."""
    return subprocess.run(
        [BIN / "trainflow", "run", "--data", data, "--dry-run", "--workdir", tmp_path / "w", *more],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {}), "COLUMNS": "400"},
    )


def test_a_folder_of_photos_gets_the_photo_recipe_and_the_dry_run_says_why(tmp_path, photos):
    done = dry_run(tmp_path, photos, env={"TRAINFLOW_TRAINING__BATCH_SIZE": "4"})
    assert (done.returncode, done.stderr) == (0, "")
    first = done.stdout.splitlines()[0]
    assert first.startswith(
        f"recipe: photos (flows/configs/photos.yaml): the images of {photos} are photo-sized (median "
    )
    assert first.endswith("a config file (--config) or a model named (training.model) overrides it")
    plan = " ".join(done.stdout.split())
    assert "--model resnet50 --image-size 224" in plan and "--epochs 12" in plan and "--lr 0.005" in plan
    assert "--batch-size 4" in plan  # the user's own setting wins over the recipe's
    assert f"bring the shrunk copy {tmp_path / 'w' / 'shrunk' / 'my-photos-500'} up to date" in plan  # max_side


def test_a_folder_of_small_images_gets_the_digits_recipe(tmp_path, small):
    done = dry_run(tmp_path, small)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[0] == (
        f"recipe: digits (flows/configs/demo.yaml): the images of {small} are small (median 32x32 px of 32 sampled, "
        "under 64 px on their shorter side); a config file (--config) or a model named (training.model) overrides it"
    )
    assert "--model resnet18 --image-size 32" in " ".join(done.stdout.split())


def test_a_config_file_training_photos_at_32_px_is_warned_in_one_line(tmp_path, photos):
    (tmp_path / "c.yaml").write_text("training: {image_size: 32, batch_size: 4}\n")
    done = dry_run(tmp_path, photos, "--config", str(tmp_path / "c.yaml"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("recipe: none, as a config file and data are given: the settings of ")
    [warning] = done.stderr.splitlines()
    assert warning.startswith(f"warning: the images of {photos} are photo-sized (median ")
    assert "the digits recipe's (flows/configs/demo.yaml)" in warning
    assert warning.endswith(
        "use the photo recipe (--config flows/configs/photos.yaml) or set training.image_size (224 for ResNet-50)"
    )
