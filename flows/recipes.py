"""The recipes: training settings that fit a kind of data, each with its one home in flows/configs/, and the choice
of the one that fills in what a run's settings leave out. Every command reads its config through cli/common.py's
`configure`, which picks the recipe here once; the run and its dry run say which and why in their first line.

    digits   flows/configs/demo.yaml     ResNet-18 at 32 px: the built-in digits set, or a folder of small images
    photos   flows/configs/photos.yaml   ResNet-50 at 224 px for fine-tuning: a folder of photographs, staged at 500 px

The choice (`choose_recipe`, a pure function of what was given): a model named (training.model) keeps the reference
defaults for the rest; no data named gets the digits recipe, as the digits set is what it trains on; a data folder
without a config file gets the recipe its images fit, from the sizes of a few of them; anything else (a config file
with data, synthetic or staged data) keeps the reference defaults, ResNet-50 on ImageNet for 90 epochs. The user's own
settings (the config file, TRAINFLOW_* variables, options) always win over the recipe's.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from flows.config import DEMO, DIGITS_TRAINING, LOCAL_DATA_FREE, FlowConfig, deep_merge, merged_values, validated
from infra.data.image_sizes import sample_image_sizes
from infra.engines import DEFAULT, ENGINES

REPO = Path(__file__).resolve().parent.parent
PHOTOS = Path(__file__).parent / "configs" / "photos.yaml"
# The median shorter side (px) from which a folder's images are photographs: the digits set's are 32, CIFAR's 32,
# MNIST's 28, while ImageNet's photographs are 150 px or more on their longer side, about 84 or more on their shorter
# one (as infra/data/photos.py draws them).
PHOTO_SIDE = 64
OVERRIDE = "a config file (--config) or a model named (training.model) overrides it"


@dataclass(frozen=True)
class Recipe:
    """Settings that fit a kind of data, from their one home, a config file of flows/configs/."""

    name: str
    path: Path
    settings: dict
    """The settings it fills in: its training section (without the demo's launcher and workers), max_side."""

    def under(self, values: dict) -> dict:
        """`values` over the recipe's settings, less those the framework's trainer lacks (the loader is PyTorch's)."""
        framework = values.get("training", {}).get("framework", DEFAULT)
        section = ENGINES.get(framework) if isinstance(framework, str) else None
        training = {k: v for k, v in self.settings["training"].items() if section is None or k in section.model_fields}
        return deep_merge({**self.settings, "training": training}, values)

    def where(self) -> str:
        """Its file, from the repository's root."""
        return str(self.path.relative_to(REPO))


DIGITS = Recipe("digits", DEMO, {"training": DIGITS_TRAINING})
PHOTO = Recipe("photos", PHOTOS, yaml.safe_load(PHOTOS.read_text()))


@dataclass(frozen=True)
class Sample:
    """The sizes (width, height) of a few training images of a data folder, read from their headers."""

    folder: str
    sizes: tuple[tuple[int, int], ...]

    def median(self) -> tuple[int, int]:
        """The size whose shorter side is the median (of an even count, the lower of the two middle ones)."""
        ordered = sorted(self.sizes, key=min)
        return ordered[(len(ordered) - 1) // 2]

    def photo_sized(self) -> bool:
        """Whether they are photographs rather than thumbnails: a median shorter side of PHOTO_SIDE px or more."""
        return bool(self.sizes) and min(self.median()) >= PHOTO_SIDE

    def describe(self) -> str:
        """ "median 500x375 px of 32 sampled"."""
        width, height = self.median()
        return f"median {width}x{height} px of {len(self.sizes)} sampled"


@dataclass(frozen=True)
class Picked:
    """The recipe a run gets (None: the reference defaults) and why, with the sample it was picked from."""

    recipe: Recipe | None
    reason: str
    sample: Sample | None = None

    def line(self) -> str:
        """What the run and its dry run say first: `recipe: photos (flows/configs/photos.yaml): why`, or, with no
        recipe, where the settings come from and why."""
        if self.recipe is None:
            return f"recipe: none, {self.reason}"
        return f"recipe: {self.recipe.name} ({self.recipe.where()}): {self.reason}"

    def warning(self, image_size: int) -> str | None:
        """One line when photographs would train at the digits recipe's image size (as blurred thumbnails)."""
        digits_size = DIGITS.settings["training"]["image_size"]
        if self.sample is None or not self.sample.photo_sized() or image_size != digits_size:
            return None
        return (
            f"warning: the images of {self.sample.folder} are photo-sized ({self.sample.describe()}) but "
            f"training.image_size is {digits_size}, the digits recipe's ({DIGITS.where()}), which trains on them "
            f"shrunk to {digits_size} px: use the photo recipe (--config {PHOTO.where()}) or set training.image_size "
            "(224 for ResNet-50)"
        )


def choose_recipe(config: Path | None, data: str | None, model_named: bool, sample: Sample | None) -> Picked:
    """The recipe that fills in what a run's settings leave out, and why, from the config file given, the data and
    whether a model is named, and the sizes sampled from the data folder (None: the data names no folder)."""
    if model_named:
        return Picked(
            None, "as a model is named (training.model): the settings given, then the reference defaults", sample
        )
    if data is None:
        return Picked(DIGITS, "no data named: the built-in digits set; a model named (training.model) overrides it")
    if config is not None:
        return Picked(
            None, f"as a config file and data are given: the settings of {config}, then the reference defaults", sample
        )
    if sample is None:
        return Picked(None, f"as data {data} names no local folder whose images could be sized: the reference defaults")
    if not sample.sizes:
        return Picked(None, f"as no image of {data}/train could be read to size: the reference defaults", sample)
    if sample.photo_sized():
        return Picked(PHOTO, f"the images of {data} are photo-sized ({sample.describe()}); {OVERRIDE}", sample)
    small = f"under {PHOTO_SIDE} px on their shorter side"
    return Picked(DIGITS, f"the images of {data} are small ({sample.describe()}, {small}); {OVERRIDE}", sample)


def pick_recipe(config: Path | None, values: dict) -> Picked:
    """choose_recipe for merged settings, sampling the images of the data folder they name (the warning needs the
    sample whatever is picked)."""
    data = str(values["data"]) if values.get("data") else None
    sample = None if data is None or data in LOCAL_DATA_FREE else Sample(data, tuple(sample_image_sizes(Path(data))))
    return choose_recipe(config, data, "model" in values.get("training", {}), sample)


def load_with_recipe(
    path: Path | None, overrides: dict, environ: Mapping[str, str] | None = None
) -> tuple[FlowConfig, Picked]:
    """The config as flows/config.py's load_config reads it, with what it leaves out filled in by the recipe that
    fits its data (under every setting the user gave), and the recipe picked."""
    values = merged_values(path, overrides, environ)
    picked = pick_recipe(path, values)
    if picked.recipe:
        values = picked.recipe.under(values)
    return validated(values, path), picked
