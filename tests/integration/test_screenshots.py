"""The docs' pictures come from a real run: `python -m cli.screenshots` trains the digits set with `trainflow run`,
serves it with `trainflow ui` and `trainflow mlflow-ui`, and saves each page as headless Chromium shows it, and the
run's plot; each picture has the viewport's size and something on it, and no process it started is left."""

import subprocess
import sys

import psutil
import pytest
from PIL import Image

from cli.screenshots import HEIGHT, PLOTS, SHOTS, WIDTH
from tests.fakes.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # one run of train-flow, 2 epochs of 3 steps
FEWEST_COLOURS = 32  # a blank or half-drawn page has a handful; the UIs' pages have hundreds


def left_behind(folder) -> list[str]:
    """The processes still running that name `folder` (the workdir every server and the run were given) in their
    command line or environment (Prefect's server: its PREFECT_HOME)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "environ"]):
        argv = " ".join(proc.info["cmdline"] or [])
        if str(folder) in argv + " ".join((proc.info["environ"] or {}).values()):
            found.append(f"{proc.info['pid']}: {argv}")
    return found


@pytest.mark.timeout(1500)
def test_the_script_takes_every_picture_from_a_real_run_and_stops_what_it_started(tmp_path):
    images, work = tmp_path / "images", tmp_path / "work"
    command = [
        sys.executable,
        "-m",
        "cli.screenshots",
        "--workdir",
        str(work),
        "--out",
        str(images),
        "--steps",
        "3",
        "--epochs",
        "2",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in images.iterdir()) == sorted([*SHOTS, *PLOTS.values()])
    for name in SHOTS:
        with Image.open(images / name) as image:
            assert (image.format, image.size) == ("PNG", (WIDTH, HEIGHT)), name
            colours = image.convert("RGB").getcolors(maxcolors=WIDTH * HEIGHT)
            assert len(colours) > FEWEST_COLOURS, f"{name}: {len(colours)} colours, a blank page?"
    plot = (images / "run-plot.svg").read_text()  # the run's chart: a panel per quantity
    assert plot.count('id="axes_') == 3 and all(f">{title}<" in plot for title in ("loss", "accuracy", "throughput"))
    assert not left_behind(work), left_behind(work)
