"""Every other loader of the trainer (--loader fast, dali) trains the digits set to the original PIL path's val
top-1, within what one run's seed alone moves it; --loader gpu (its CPU device here) trains the digits set as JPEGs
to the fast loader's val top-1, the same seed drawing the same crops."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flows.config import DIGITS_TRAINING
from infra.data.sample_data import write_digits
from tests.fakes.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long, pytest.mark.xdist_group("loaders")]
# Of val top-1, a fraction: 5.4 of the 359 val images. One loader's own seeds spread its top-1 over 1.39 points
# (fast, seeds 0-2, measured 2026-11-24: 0.9805, 0.9833, 0.9944; pil 0.9916, 0.9916, 0.9889), and which images a run
# gets right also follows the machine's floating-point kernels: one run of each cannot tell half a point apart.
# Averaged over those 3 seeds, fast is 0.46 points below pil (docs/benchmarks/earlier-training.md).
SEED_SPREAD = 0.015
LOADERS = ("pil", "fast", "dali")  # dali: its CPU-only mode (no GPU here)
TRAIN_PY = REPO / "containers" / "trainer" / "train.py"


def digits_command(digits: Path, out: Path, loader: str, **overrides) -> list[str]:
    """The engine on the digits set's own settings (`overrides` changed), in one process on one thread (no
    DataLoader workers)."""
    settings = {
        **DIGITS_TRAINING,
        "loader_workers": 0,
        "checkpoint_every": 0,
        "log_every": 100,
        "threads": 1,
        **overrides,
    }
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
    metrics = train_side_by_side({loader: (digits, loader, {}) for loader in LOADERS}, tmp_path_factory)
    return {loader: found["final_val_top1"] for loader, found in metrics.items()}


def train_side_by_side(runs: dict[str, tuple[Path, str, dict]], tmp_path_factory) -> dict[str, dict]:
    """The metrics.json of each run (name: data, loader, settings changed), the runs trained at once."""
    outs = {name: tmp_path_factory.mktemp(name) for name in runs}
    started = {
        name: subprocess.Popen(
            digits_command(data, outs[name], loader, **overrides),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (data, loader, overrides) in runs.items()
    }
    try:
        for name, run in started.items():
            _, err = run.communicate(timeout=1800)
            assert run.returncode == 0, f"{name}: {err[-2000:]}"
    finally:
        for run in started.values():
            run.kill()
    return {name: json.loads((out / "metrics.json").read_text()) for name, out in outs.items()}


@pytest.mark.timeout(3600)  # three trainings of the digits set: about 2 minutes each on an idle core, far more shared
@pytest.mark.parametrize("loader", [loader for loader in LOADERS if loader != "pil"])
def test_a_loader_trains_the_digits_set_to_the_pil_path_s_accuracy(top1, loader):
    """Measured with these settings on 2026-11-23: pil 0.9861, fast 0.9889, dali 0.9889; on 2026-11-24, another
    machine: pil 0.9916, fast 0.9805 (one image is 0.28 points). The paths resize with other arithmetic, so their
    runs part ways as a new seed does."""
    assert top1["pil"] > 0.95  # trained, not guessing
    assert top1[loader] == pytest.approx(top1["pil"], abs=SEED_SPREAD)


@pytest.mark.timeout(900)  # two trainings of 4 epochs side by side: about 60 s on an idle 2-core machine
def test_the_gpu_loader_trains_the_jpeg_digits_to_the_fast_loader_s_accuracy(tmp_path_factory):
    """The digits as grayscale JPEGs (so that --loader gpu decodes them in its thread, not in the workers), the same
    seed. With the CPU as its device the gpu loader decodes with libjpeg-turbo, the
    pixels of the fast loader's partial decode: measured 2026-11-27, both 0.9749 val top-1 after these 4 epochs
    (0.9889 after the digits set's 8), every loss line the same; the issue asks for 0.5 point."""
    jpegs = write_digits(tmp_path_factory.mktemp("data") / "digits-jpeg", fmt="jpg")
    settings = {"epochs": 4}  # no DataLoader workers: the forked ones are tests/unit/trainer/test_gpu_loader.py's
    metrics = train_side_by_side({loader: (jpegs, loader, settings) for loader in ("fast", "gpu")}, tmp_path_factory)
    assert metrics["fast"]["final_val_top1"] > 0.9  # trained, not guessing
    assert metrics["gpu"]["final_val_top1"] == pytest.approx(metrics["fast"]["final_val_top1"], abs=0.005)
    tally = metrics["gpu"]["gpu_decoding"]  # every batch's JPEGs decoded in one call, none on the CPU
    assert tally["batches"] > 0 and tally["batches_decoded_at_once"] == tally["batches"]
    assert tally["images_decoded_on_cpu"] == 0
    losses = {loader: [epoch["train_loss"] for epoch in found["epochs"]] for loader, found in metrics.items()}
    assert losses["gpu"] == pytest.approx(losses["fast"], rel=1e-6)  # the same crops, order and pixels
