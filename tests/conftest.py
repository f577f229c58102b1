"""Shared fixtures: the small digits data set and hand-made image trees."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from infra.azurite import running_azurite
from infra.sample_data import write_digits


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> Path:
    """scikit-learn's digits as 32x32 PNGs in ImageNet layout, written once per test session."""
    return write_digits(tmp_path_factory.mktemp("data") / "digits")


def write_image(path: Path, mode: str = "RGB", size: int = 12, fmt: str | None = None) -> Path:
    """A small random image in the given PIL mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(path)))
    channels = {"L": 1, "RGB": 3, "RGBA": 4, "CMYK": 4}[mode if mode != "P" else "L"]
    pixels = rng.integers(0, 255, (size, size, channels), dtype=np.uint8).squeeze()
    image = Image.fromarray(pixels, mode="L" if mode == "P" else mode)
    if mode == "P":
        image = image.convert("P")
        image.info["transparency"] = 0
    image.save(path, format=fmt)
    return path


@pytest.fixture
def image_tree(tmp_path) -> Path:
    """A two-class train/val tree with the awkward cases real data sets hold."""
    root = tmp_path / "mixed data"
    write_image(root / "train" / "cat" / "gray.png", "L")
    write_image(root / "train" / "cat" / "cmyk.jpg", "CMYK", fmt="JPEG")
    write_image(root / "train" / "cat" / "nested" / "deeper" / "rgba.png", "RGBA")
    write_image(root / "train" / "chat noir é" / "palette transparent.png", "P")
    write_image(root / "train" / "chat noir é" / "日本語 名前.png", "RGB")
    write_image(root / "train" / "chat noir é" / "plain.JPEG", "RGB", fmt="JPEG")
    write_image(root / "val" / "cat" / "v1.png", "RGB")
    write_image(root / "val" / "chat noir é" / "v2.png", "L")
    (root / "train" / "cat" / ".DS_Store").write_bytes(b"\0\1")
    return root


@pytest.fixture(scope="session")
def azurite_port(tmp_path_factory) -> int:
    """A real Azurite for the whole test session, started the way trainflow starts it."""
    with running_azurite(tmp_path_factory.mktemp("azurite")) as port:
        yield port
