"""Every other loader of the trainer (--loader fast, dali) trains the digits set to the original PIL path's val
top-1, within what one run's seed alone moves it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flows.config import DIGITS_TRAINING
from tests.fakes.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("loaders")]  # top1 trains once
# Of val top-1, a fraction: 5.4 of the 359 val images. One loader's own seeds spread its top-1 over 1.39 points
# (fast, seeds 0-2, measured 2026-11-24: 0.9805, 0.9833, 0.9944; pil 0.9916, 0.9916, 0.9889), and which images a run
# gets right also follows the machine's floating-point kernels: one run of each cannot tell half a point apart.
# Averaged over those 3 seeds, fast is 0.46 points below pil (docs/guides/gpus-and-loaders.md).
SEED_SPREAD = 0.015
LOADERS = ("pil", "fast", "dali")  # dali: its CPU-only mode (no GPU here)
TRAIN_PY = REPO / "containers" / "trainer" / "train.py"


def digits_command(digits: Path, out: Path, loader: str) -> list[str]:
    """The engine on the digits set's own settings, in one process on one thread (no DataLoader workers)."""
    settings = {**DIGITS_TRAINING, "loader_workers": 0, "checkpoint_every": 0, "log_every": 100, "threads": 1}
    flags = [
        f"--{k.replace('_', '-')}"
        if v is True
        else f"--no-{k.replace('_', '-')}"
        if v is False
        else f"--{k.replace('_', '-')}={v}"
        for k, v in settings.items()
    ]
    return [sys.executable, str(TRAIN_PY), "--data", str(digits), "--out", str(out), "--loader", loader, *flags]


@pytest.fixture(scope="module")
def top1(digits, tmp_path_factory) -> dict[str, float]:
    """Each loader's final val top-1, the three trained at once (one thread each, so that the 2 cores run them
    side by side: the same results as one after the other, in half the time)."""
    outs = {loader: tmp_path_factory.mktemp(loader) for loader in LOADERS}
    runs = {
        loader: subprocess.Popen(
            digits_command(digits, out, loader), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for loader, out in outs.items()
    }
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
    """Measured with these settings on 2026-11-23: pil 0.9861, fast 0.9889, dali 0.9889; on 2026-11-24, another
    machine: pil 0.9916, fast 0.9805 (one image is 0.28 points). The paths resize with other arithmetic, so their
    runs part ways as a new seed does."""
    assert top1["pil"] > 0.95  # trained, not guessing
    assert top1[loader] == pytest.approx(top1["pil"], abs=SEED_SPREAD)
