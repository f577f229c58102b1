"""Every other loader of the trainer (--loader fast, dali) trains the digits set to the original PIL path's val
top-1, within half a point."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.sample_data import DIGITS_TRAINING

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HALF_A_POINT = 0.005  # of val top-1, a fraction: 1.8 of the 359 val images
LOADERS = ("pil", "fast", "dali")  # dali: its CPU-only mode (no GPU here)
TRAIN_PY = Path(__file__).resolve().parents[2] / "containers" / "trainer" / "train.py"


def digits_command(digits: Path, out: Path, loader: str) -> list[str]:
    """The engine on the digits set's own settings, in one process on one thread (no DataLoader workers)."""
    settings = {**DIGITS_TRAINING, "loader_workers": 0, "checkpoint_every": 0, "log_every": 100, "threads": 1}
    flags = [f"--{k.replace('_', '-')}" if v is True else f"--no-{k.replace('_', '-')}" if v is False else
             f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    return [sys.executable, str(TRAIN_PY), "--data", str(digits), "--out", str(out), "--loader", loader, *flags]


@pytest.fixture(scope="module")
def top1(digits, tmp_path_factory) -> dict[str, float]:
    """Each loader's final val top-1, the three trained at once (one thread each, so that the 2 cores run them
    side by side: the same results as one after the other, in half the time)."""
    outs = {loader: tmp_path_factory.mktemp(loader) for loader in LOADERS}
    runs = {loader: subprocess.Popen(digits_command(digits, out, loader), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True) for loader, out in outs.items()}
    try:
        for loader, run in runs.items():
            _, err = run.communicate(timeout=1800)
            assert run.returncode == 0, f"--loader {loader}: {err[-2000:]}"
    finally:
        for run in runs.values():
            run.kill()
    return {loader: json.loads((out / "metrics.json").read_text())["final_val_top1"] for loader, out in outs.items()}


@pytest.mark.timeout(3600)  # three trainings of the digits set: about 2 minutes each on an idle core, far more shared
@pytest.mark.parametrize("loader", [loader for loader in LOADERS if loader != "pil"])
def test_a_loader_trains_the_digits_set_to_the_pil_path_s_accuracy(top1, loader):
    """Measured on 2026-11-23 with these settings: pil 0.9861, fast 0.9889, dali 0.9889 (one image more right of
    359; one image is 0.28 points). The paths resize with other arithmetic, so their runs part ways: with one
    DataLoader worker instead of none, fast reached 0.9944 against pil's 0.9861, 0.83 points apart."""
    assert top1["pil"] > 0.95  # trained, not guessing
    assert top1[loader] == pytest.approx(top1["pil"], abs=HALF_A_POINT)
