"""The recipes (flows/recipes.py): the choice of the one that fills in a run's settings, a pure function tested on what
it is given; the recipes' files, each the one home of its settings and a config trainflow accepts; what a recipe fills
in under the user's own settings; the warning for photographs at the digits recipe's 32 px."""

from pathlib import Path

import pytest
import yaml

from flows.config import DIGITS_TRAINING, load_config
from flows.recipes import DIGITS, PHOTO, PHOTO_SIDE, Picked, Sample, choose_recipe, load_with_recipe
from infra.engines.gpus import visible_gpus
from infra.engines.tensorflow import KerasTraining
from nodelib.cores import usable_cores
from tests.fakes.image_files import write_png_header
from tests.fakes.paths import REPO

OVERRIDE = "a config file (--config) or a model named (training.model) overrides it"


def sized(*sizes: tuple[int, int], count: int = 1) -> Sample:
    """A sample of ./my-photos holding each size `count` times."""
    return Sample("./my-photos", tuple(size for size in sizes for _ in range(count)))


def test_photo_sized_images_get_the_photo_recipe_and_the_line_says_why():
    picked = choose_recipe(None, "./my-photos", False, Sample("./my-photos", ((500, 375),) * 20 + ((375, 500),) * 12))
    assert picked.recipe is PHOTO
    assert picked.line() == (
        "recipe: photos (flows/configs/photos.yaml): the images of ./my-photos are photo-sized (median 500x375 px of "
        f"32 sampled); {OVERRIDE}"
    )


def test_small_images_get_the_digits_recipe():
    picked = choose_recipe(None, "./my-digits", False, Sample("./my-digits", ((28, 28),) * 32))
    assert picked.recipe is DIGITS
    assert picked.line() == (
        "recipe: digits (flows/configs/demo.yaml): the images of ./my-digits are small (median 28x28 px of 32 "
        f"sampled, under 64 px on their shorter side); {OVERRIDE}"
    )


@pytest.mark.parametrize(("photos", "small", "recipe"), [(17, 15, PHOTO), (16, 16, DIGITS), (15, 17, DIGITS)])
def test_a_mixed_folder_goes_by_the_median_shorter_side(photos, small, recipe):
    sample = Sample("d", ((640, 480),) * photos + ((32, 32),) * small)
    assert choose_recipe(None, "d", False, sample).recipe is recipe  # a tie: the lower middle one, small


@pytest.mark.parametrize(
    ("size", "recipe"),
    [((1000, PHOTO_SIDE - 1), DIGITS), ((PHOTO_SIDE, 1000), PHOTO), ((PHOTO_SIDE, PHOTO_SIDE), PHOTO)],
)
def test_the_shorter_side_decides(size, recipe):
    assert choose_recipe(None, "d", False, sized(size, count=5)).recipe is recipe


def test_a_folder_with_no_image_to_size_keeps_the_reference_defaults():
    picked = choose_recipe(None, "./my-photos", False, Sample("./my-photos", ()))  # empty, or no file an image
    assert picked.recipe is None
    assert picked.line() == (
        "recipe: none, as no image of ./my-photos/train could be read to size: the reference defaults"
    )


def test_what_the_user_named_comes_before_the_images():
    photos, config = sized((500, 375), count=8), Path("mine.yaml")
    assert choose_recipe(None, "./my-photos", True, photos).recipe is None  # a model named
    assert choose_recipe(config, "./my-photos", False, photos).recipe is None  # a config file and data
    assert choose_recipe(config, None, False, None).recipe is DIGITS  # a config file without data: the digits set
    no_data = choose_recipe(None, None, False, None)
    assert no_data.recipe is DIGITS and no_data.reason.startswith("no data named: the built-in digits set")
    assert choose_recipe(None, "synthetic", False, None).recipe is None  # no folder to look at


def test_photos_at_the_digits_size_warn_naming_the_recipe_and_the_fix():
    picked = Picked(None, "a config file and data are given", sized((500, 375), count=8))
    assert picked.warning(32) == (
        "warning: the images of ./my-photos are photo-sized (median 500x375 px of 8 sampled) but training.image_size "
        "is 32, the digits recipe's (flows/configs/demo.yaml), which trains on them shrunk to 32 px: use the photo "
        "recipe (--config flows/configs/photos.yaml) or set training.image_size (224 for ResNet-50)"
    )
    assert picked.warning(224) is None
    assert Picked(DIGITS, "small", sized((32, 32), count=8)).warning(32) is None
    assert Picked(DIGITS, "no data", None).warning(32) is None


def test_each_recipe_file_is_a_config_and_its_recipes_one_home():
    photos = load_config(PHOTO.path, {}, environ={})
    assert photos.max_side == 500 and PHOTO.settings == yaml.safe_load(PHOTO.path.read_text())
    assert (photos.training.model, photos.training.image_size, photos.training.hflip) == ("resnet50", 224, True)
    assert photos.training.loader == "auto" and photos.training.warmup_epochs == 1  # any framework's (no loader)
    assert DIGITS.settings == {"training": DIGITS_TRAINING}


def test_the_gpu_workstation_config_runs_one_worker_a_gpu_under_torchrun_in_bf16():
    cfg = load_config(REPO / "flows" / "configs" / "gpu-workstation.yaml", {}, environ={})
    counted = visible_gpus() or usable_cores()  # auto: one a GPU (here, with none, one a core)
    assert cfg.pool.backend == "process" and cfg.pool.slots_per_node == cfg.training.workers == counted
    training = cfg.training
    assert (training.launcher, training.device, training.precision, training.loader, training.loader_workers) == (
        "torchrun",
        "cuda",
        "bf16",
        "auto",
        "auto",
    )


@pytest.fixture
def photos(tmp_path) -> Path:
    """Two classes of PNG headers that claim 500x375 px (sizing reads nothing more)."""
    for i in range(8):
        write_png_header(tmp_path / "photos" / "train" / "ab"[i % 2] / f"{i}.png", 500, 375)
    return tmp_path / "photos"


def test_the_photo_recipe_fills_in_what_the_user_leaves_out(photos):
    cfg, picked = load_with_recipe(None, {"data": str(photos)}, environ={"TRAINFLOW_TRAINING__EPOCHS": "3"})
    assert picked.recipe is PHOTO and cfg.max_side == 500
    assert (cfg.training.model, cfg.training.image_size, cfg.training.lr) == ("resnet50", 224, 0.005)
    assert cfg.training.epochs == 3  # the user's own wins
    mine = load_with_recipe(None, {"data": str(photos), "max_side": 300, "training": {"hflip": False}}, environ={})[0]
    assert (mine.max_side, mine.training.hflip, mine.training.epochs) == (300, False, 12)


def test_a_framework_without_the_fast_loader_gets_the_rest_of_the_photo_recipe(photos):
    cfg = load_with_recipe(None, {"data": str(photos), "training": {"framework": "keras"}}, environ={})[0]
    assert isinstance(cfg.training, KerasTraining) and (cfg.training.image_size, cfg.training.epochs) == (224, 12)


def test_a_config_file_with_photos_keeps_its_settings_and_is_warned_about_32_px(photos, tmp_path):
    (tmp_path / "c.yaml").write_text("training: {image_size: 32}\n")
    cfg, picked = load_with_recipe(tmp_path / "c.yaml", {"data": str(photos)}, environ={})
    assert picked.recipe is None and (cfg.training.epochs, cfg.training.image_size) == (90, 32)
    assert picked.warning(cfg.training.image_size) is not None


def test_the_gpu_workstation_guides_blocks_are_the_recipe_and_one_whole_photo_block_to_replace_it(tmp_path):
    """docs/guides/gpu-workstation.md: its first block is the recipe's settings; its second replaces the recipe's
    training block whole (a file holds one) and adds the photo recipe's settings, lr scaled to batch 128."""
    page = (REPO / "docs" / "guides" / "gpu-workstation.md").read_text()
    first, second = [yaml.safe_load(block.split("```", 1)[0]) for block in page.split("```yaml\n")[1:3]]
    recipe = yaml.safe_load((REPO / "flows" / "configs" / "gpu-workstation.yaml").read_text())
    assert first == recipe
    photos = yaml.safe_load(PHOTO.path.read_text())
    edited = tmp_path / "my-gpus.yaml"
    edited.write_text(yaml.safe_dump({"max_side": second["max_side"], "pool": recipe["pool"], **second}))
    cfg = load_config(edited, {}, environ={})
    assert cfg.max_side == photos["max_side"] and cfg.training.batch_size == 128 and cfg.training.lr == 0.02
    kept = {k: v for k, v in recipe["training"].items() if k != "lr"}
    assert kept.items() <= second["training"].items()
    assert (
        {"epochs": 12, "warmup_epochs": 1}.items()
        <= second["training"].items()
        <= {
            **photos["training"],
            **kept,
            "lr": 0.02,  # the photo recipe's, at this recipe's batch size
        }.items()
    )
