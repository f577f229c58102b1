"""Every other loader of the trainer (--loader fast, dali) trains the digits set to the original PIL path's val
top-1, within half a point."""

import json

import pytest

from infra.sample_data import DIGITS_TRAINING
from trainer.train import main as engine_main

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HALF_A_POINT = 0.005  # of val top-1, a fraction: 1.8 of the 359 val images


def digits_top1(digits, out, loader: str) -> float:
    """The digits set's own settings, in one process on one thread (no DataLoader workers): the final val top-1."""
    settings = {**DIGITS_TRAINING, "loader_workers": 0, "checkpoint_every": 0, "log_every": 100, "threads": 1}
    flags = [f"--{k.replace('_', '-')}" if v is True else f"--no-{k.replace('_', '-')}" if v is False else
             f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    assert engine_main(["--data", str(digits), "--out", str(out), "--loader", loader, *flags]) == 0
    return json.loads((out / "metrics.json").read_text())["final_val_top1"]


@pytest.fixture(scope="module")
def pil_top1(digits, tmp_path_factory) -> float:
    """The original path's accuracy, trained once for every loader compared with it."""
    return digits_top1(digits, tmp_path_factory.mktemp("pil"), "pil")


@pytest.mark.timeout(3600)  # three trainings of the digits set: about 2 minutes each on 2 idle cores, far more shared
@pytest.mark.parametrize("loader", ["fast", "dali"])  # dali: its CPU-only mode (no GPU here)
def test_a_loader_trains_the_digits_set_to_the_pil_path_s_accuracy(digits, tmp_path, pil_top1, loader):
    """Measured on 2026-11-23 with these settings: pil 0.9861, fast 0.9889, dali 0.9889 (one image more right of
    359; one image is 0.28 points). The paths resize with other arithmetic, so their runs part ways: with one
    DataLoader worker instead of none, fast reached 0.9944 against pil's 0.9861, 0.83 points apart."""
    assert pil_top1 > 0.95  # trained, not guessing
    assert digits_top1(digits, tmp_path, loader) == pytest.approx(pil_top1, abs=HALF_A_POINT)
