"""`trainflow data add-restart-markers`: a folder's training JPEGs rewritten losslessly with restart markers, what it
cannot rewrite left as it was, a second run rewriting nothing, and Ctrl-C leaving every file whole."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from infra.data.restart_markers import TEMPORARY
from infra.data.restart_markers import pixels as decoded
from infra.data.sample_data import write_imagenet_shaped
from tests.fakes.image_files import write_image
from trainer import jpeg_crop

pytestmark = pytest.mark.integration
TRAINFLOW = str(Path(sys.executable).with_name("trainflow"))


def add_restart_markers(data: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TRAINFLOW, "data", "add-restart-markers", "--data", str(data), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def photo(path: Path, mode: str = "RGB", **save) -> Path:
    """A 203x117 JPEG with detail in every block (partial MCUs at the right and bottom edges)."""
    rng = np.random.default_rng(len(str(path)))
    pixels = rng.normal(128, 40, (117, 203, 3)).clip(0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).convert(mode).save(path, "JPEG", quality=90, **save)
    return path


def test_the_training_jpegs_are_rewritten_losslessly_and_the_rest_left_as_they_were(tmp_path):
    data = tmp_path / "data"
    rewritable = [
        photo(data / "train" / "a" / "colour.jpg", subsampling=2),
        photo(data / "train" / "a" / "gray.jpeg", "L"),
        photo(data / "train" / "b" / "full.JPG", subsampling=0),
        photo(data / "train" / "b" / "progressive.jpg", progressive=True),
        photo(data / "train" / "b" / "someone else's.jpg"),
    ]
    os.chown(rewritable[-1], 65534, 65534)  # this runs as root (the suite's machines do): the owner is kept
    cut = data / "train" / "b" / "cut.jpg"
    cut.write_bytes(photo(tmp_path / "whole.jpg").read_bytes()[:2000])
    outside = photo(tmp_path / "elsewhere" / "shared.jpg")
    (data / "train" / "a" / "link.jpg").symlink_to(outside)
    os.link(photo(data / "train" / "b" / "twice.jpg"), tmp_path / "twice-again.jpg")
    frozen = photo(data / "train" / "b" / "frozen.jpg")
    frozen.chmod(0o444)
    kept = {
        "CMYK": write_image(data / "train" / "b" / "cmyk.jpg", "CMYK", fmt="JPEG"),
        "libjpeg refused it": cut,
        "a symbolic link": data / "train" / "a" / "link.jpg",
        "hard-linked (2 names)": data / "train" / "b" / "twice.jpg",
        "read-only": frozen,
    }
    unlisted = {"not a JPEG": write_image(data / "train" / "a" / "png.png"), "val": photo(data / "val" / "a" / "v.jpg")}
    rewritable[1].chmod(0o600)
    before = {path: path.read_bytes() for path in [*rewritable, *kept.values(), *unlisted.values(), outside]}
    leftovers = [data / "train" / "a" / f".x{TEMPORARY}", data / "train" / "b" / "nested" / f".y{TEMPORARY}"]
    for leftover in leftovers:  # as a run killed mid-write leaves them, at any depth
        leftover.parent.mkdir(exist_ok=True)
        leftover.write_bytes(b"half")

    out = add_restart_markers(data)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = out.stdout.splitlines()[0]
    assert (
        summary.startswith(f"{data}/train: 11 images in ")
        and (": 5 rewritten, 0 already had them, 5 JPEGs left as they were, 1 not JPEGs; ") in summary
    ), out.stdout
    for path in rewritable:
        now = path.read_bytes()
        assert now != before[path] and jpeg_crop.cuttable(now) and decoded(now) == decoded(before[path]), path
    assert oct(rewritable[1].stat().st_mode & 0o777) == "0o600"
    assert (rewritable[-1].stat().st_uid, rewritable[-1].stat().st_gid) == (65534, 65534)
    for why, path in kept.items():
        assert path.read_bytes() == before[path], why
        assert f"left as it was: {path} ({why}" in out.stdout
    for why, path in unlisted.items():
        assert path.read_bytes() == before[path] and str(path) not in out.stdout, why
    assert outside.read_bytes() == before[outside] and (data / "train" / "a" / "link.jpg").is_symlink()
    assert os.stat(kept["hard-linked (2 names)"]).st_nlink == 2
    assert not any(leftover.exists() for leftover in leftovers)
    assert "removed 2 temporary files an interrupted run had left" in out.stdout

    again = add_restart_markers(data, "--workers", "1")
    assert (
        again.returncode == 0
        and ": 0 rewritten, 5 already had them, 5 JPEGs left as they were, 1 not JPEGs; " in again.stdout
    )


def test_a_folder_without_jpegs_is_said_to_have_none(tmp_path):
    write_image(tmp_path / "data" / "train" / "a" / "one.png")
    out = add_restart_markers(tmp_path / "data")
    assert out.returncode == 0 and "no JPEGs to rewrite" in out.stdout


def test_bad_input_is_refused_in_one_line(tmp_path):
    out = subprocess.run([TRAINFLOW, "data", "add-restart-markers"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: add-restart-markers needs --data DIR: the ImageNet-layout folder whose train/ JPEGs to rewrite"
    )
    out = add_restart_markers(tmp_path / "nowhere")
    assert out.returncode == 2 and out.stderr.strip() == (
        f"error: data folder {tmp_path / 'nowhere'} does not exist; point --data at a folder holding "
        "train/<class>/ images"
    )


def test_ctrl_c_leaves_every_file_whole_and_a_second_run_finishes_the_rest(tmp_path):
    data = tmp_path / "data"
    write_imagenet_shaped(data, 8, 1500, 0)  # 12,000 small JPEGs: several seconds of work on two processes
    paths = sorted((data / "train").rglob("*.JPEG"))
    before = {path: path.read_bytes() for path in paths}
    proc = subprocess.Popen(
        [TRAINFLOW, "data", "add-restart-markers", "--data", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while sum(jpeg_crop.cuttable(p.read_bytes()) for p in paths[::50]) < 5:  # some files rewritten, most not
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
    family = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output[-2000:]
    assert "Traceback" not in output and output.strip().splitlines()[-1].startswith("interrupted")
    assert psutil.wait_procs(family, timeout=10)[1] == []
    assert not list((data / "train").rglob(f"*{TEMPORARY}"))
    rewritten = [p for p in paths if p.read_bytes() != before[p]]
    assert 0 < len(rewritten) < len(paths)
    for path in paths[::25] + rewritten[::25]:
        now = path.read_bytes()
        assert now == before[path] or (jpeg_crop.cuttable(now) and decoded(now) == decoded(before[path]))

    out = add_restart_markers(data)
    assert out.returncode == 0
    assert (
        f": {len(paths) - len(rewritten):,} rewritten, {len(rewritten):,} already had them, 0 JPEGs left" in out.stdout
    )
