"""Bad data found by a worker mid-run: the rank and the file; images that cannot be decoded, found before the run,
refused all at once or left out, and a checked data version trusted. (Other bad input: tests/fakes/bad_inputs.py.)"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.core.errors import BadInput
from infra.data.sample_data import write_imagenet_shaped
from infra.engines.contract import PACKAGE
from infra.engines.launchers import local_command
from infra.engines.pytorch import PyTorchTraining
from nodelib.verified import write_verified
from tests.fakes.bad_inputs import images
from tests.fakes.image_files import write_image, write_png_header
from tests.fakes.training import train_locally

pytestmark = pytest.mark.integration
TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
QUICK = ["--model", "resnet18", "--epochs", "1", "--workers", "2", "--batch-size", "1"]


def with_bombs(root: Path) -> Path:
    """A two-class data folder whose class a holds three images too large to decode."""
    images(root)
    for i in range(3):  # whatever the shuffle, some worker's first batch holds a bomb
        write_png_header(root / "train" / "a" / f"huge{i}.png", 20000, 20000)
    return root


def test_a_bomb_found_by_a_worker_names_the_rank_and_the_file(tmp_path):
    data = with_bombs(tmp_path / "data")
    config = tmp_path / "c.yaml"
    config.write_text("training: {preflight_images: false, image_size: 16, loader_workers: 1}\n")
    result = subprocess.run(
        [
            TRAINFLOW,
            "train",
            "--config",
            str(config),
            *QUICK[:-1],
            "2",
            "--data",
            str(data),
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert re.search(r"rank \d failed: image .*/train/a/huge\d?.png has 400000000 pixels", result.stderr), result.stderr


# Images that cannot be decoded, found before training: all at once, refused in one line or left out.
TINY = [
    "--model",
    "resnet18",
    "--image-size",
    "16",
    "--epochs",
    "1",
    "--batch-size",
    "2",
    "--steps-per-epoch",
    "3",
    "--loader-workers",
    "0",
    "--threads",
    "1",
    "--checkpoint-every",
    "0",
]
ERROR = re.compile(r"\[rank (\d)\].* ERROR error: (.*)")


def good_and_bad(root: Path, bad: int = 30) -> tuple[Path, set[str]]:
    """Two classes of 10 good PNGs (and a val image each) with `bad` corrupt files of several kinds among them;
    the folder and the bad files' paths relative to it."""
    for name in "ab":
        for i in range(10):
            write_image(root / "train" / name / f"ok{i}.png")
        write_image(root / "val" / name / "v.jpg", fmt="JPEG")
    names = set()
    for i in range(bad):
        path = root / "train" / "ab"[i % 2] / f"bad{i:02d}.{('png', 'jpg', 'JPEG')[i % 3]}"
        if i % 3 == 1:  # a JPEG cut short: its header is fine, its pixels are not
            path.write_bytes(write_image(path, fmt="JPEG", size=64).read_bytes()[:300])
        else:
            path.write_bytes(b"not an image %d" % i)
        names.add(path.relative_to(root).as_posix())
    return root, names


def torchrun(data: Path, out: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict[int, str]]:
    """train.py under torchrun with 2 processes; the run and each rank's lines."""
    argv = [str(PACKAGE / "train.py"), "--data", str(data), "--out", str(out), *TINY, *options]
    done = subprocess.run(local_command("torchrun", 2, argv), capture_output=True, text=True, timeout=300)
    ranks = {
        rank: "\n".join(line for line in done.stdout.splitlines() if line.startswith(f"[rank {rank}]"))
        for rank in (0, 1)
    }
    return done, ranks


def check(data: Path, out: Path, *options: str) -> subprocess.CompletedProcess:
    """The preflight: train.py --check in one process."""
    argv = [
        sys.executable,
        str(PACKAGE / "train.py"),
        "--data",
        str(data),
        "--out",
        str(out),
        *TINY,
        "--check",
        *options,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def listed(path: Path) -> set[str]:
    """The paths a bad-files list holds (each line `path<TAB>reason`, with a reason)."""
    pairs = [line.split("\t") for line in path.read_text().splitlines()]
    assert all(len(pair) == 2 and pair[1] for pair in pairs)
    return {path for path, _ in pairs}


def one_line_error(data: Path, out: Path, count: int) -> re.Pattern:
    return re.compile(
        rf"^{count} of {20 + 2 + count} images in {re.escape(str(data))} cannot be decoded \(first: "
        rf"train/a/bad00.png: cannot identify image file\); all {count} are listed in "
        rf"{re.escape(str(out / 'bad-files.tsv'))}; replace or remove them, or pass --bad-files skip"
    )


def test_thirty_bad_images_are_refused_in_one_line_that_names_a_list_of_all_of_them(tmp_path):
    data, bad = good_and_bad(tmp_path / "data")
    out = tmp_path / "out"
    done, _ = torchrun(data, out, "--verify-images")  # no preflight: each rank decodes its share
    errors = [m.groups() for m in map(ERROR.search, done.stdout.splitlines()) if m]
    assert done.returncode != 0 and "exitcode  : 2" in done.stderr
    assert sorted(rank for rank, _ in errors) == ["0", "1"] and errors[0][1] == errors[1][1]  # one line, the same
    assert one_line_error(data, out, 30).match(errors[0][1]), errors[0][1]
    assert listed(out / "bad-files.tsv") == bad
    assert done.stdout.count("WARNING   cannot decode ") == 20 and "... and 10 more" in done.stdout

    preflight = check(data, tmp_path / "checked", "--verify-images")
    assert preflight.returncode == 2
    assert one_line_error(data, tmp_path / "checked", 30).match(ERROR.search(preflight.stdout).group(2))
    assert listed(tmp_path / "checked" / "bad-files.tsv") == bad


def test_with_skip_both_ranks_train_without_the_same_thirty(tmp_path):
    data, bad = good_and_bad(tmp_path / "data")
    out = tmp_path / "out"
    done, ranks = torchrun(data, out, "--verify-images", "--bad-files", "skip")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "complete" and metrics["parameters_in_sync"] is True
    assert (metrics["train_images"], metrics["val_images"]) == (20, 2)
    assert metrics["bad_files"]["count"] == 30 and metrics["bad_files"]["list"] == str(out / "bad-files.tsv")
    assert len(metrics["bad_files"]["first"]) == 20 and {p for p, _ in metrics["bad_files"]["first"]} <= bad
    assert listed(out / "bad-files.tsv") == bad
    said = [re.findall(r"INFO (images: leaving out .*|data: training on .*)", ranks[rank]) for rank in (0, 1)]
    assert said[0] == said[1] and "data: training on 20 images, validating on 2" in said[0]


def test_the_preflight_decodes_once_and_the_workers_skip_what_it_found(tmp_path):
    data, bad = good_and_bad(tmp_path / "data")
    settings = dict(
        workers=2,
        model="resnet18",
        image_size=16,
        epochs=1,
        batch_size=2,
        steps_per_epoch=3,
        loader_workers=0,
        checkpoint_every=0,
    )
    with pytest.raises(BadInput) as refused:  # the orchestrator's run: its preflight, then its workers
        train_locally(PyTorchTraining(**settings), str(data), tmp_path / "refused", lambda line: None)
    assert one_line_error(data, tmp_path / "refused", 30).match(str(refused.value)), str(refused.value)

    out = tmp_path / "out"
    metrics = train_locally(PyTorchTraining(**settings, bad_files="skip"), str(data), out, lambda line: None)
    assert metrics["bad_files"]["count"] == 30 and metrics["train_images"] == 20
    for rank in (0, 1):
        log = (out / "logs" / f"rank{rank}.log").read_text()
        assert f"the preflight's decode ({out / 'images-checked.json'})" in log and "decoded in this run" not in log


def test_a_verified_data_version_is_trusted_and_an_unverified_folder_is_checked(tmp_path):
    data, _ = good_and_bad(tmp_path / "data", bad=0)
    (data / "train" / "a" / "listed.png").write_bytes(b"really corrupt, and the sync said so")
    (data / "train" / "b" / "sneaky.png").write_bytes(b"really corrupt, and the sync said it was fine")
    write_verified(data, "v-42", 24, [("train/a/listed.png", "cannot identify image file")])
    trusted = check(data, tmp_path / "o1", "--verify-images", "--bad-files", "skip")
    assert trusted.returncode == 0, trusted.stdout
    assert "sneaky" not in trusted.stdout and "data version v-42" in trusted.stdout  # nothing was decoded

    (data / ".verified.json").unlink()  # a plain local folder now: decoded, both found
    caught = check(data, tmp_path / "o2", "--verify-images")
    assert caught.returncode == 2 and "2 of 24 images" in ERROR.search(caught.stdout).group(2)
    assert listed(tmp_path / "o2" / "bad-files.tsv") == {"train/a/listed.png", "train/b/sneaky.png"}

    (data / ".verified.json").write_text('{"format": 1, "version": "v-42"}')
    broken = check(data, tmp_path / "o3", "--verify-images")
    assert broken.returncode == 2
    assert (
        ERROR.search(broken.stdout).group(2).startswith(f"{data / '.verified.json'} is not a valid verification record")
    )

    (data / "train" / "b" / "sneaky.png").unlink()
    write_verified(data, "v-43", 23, [("train/a/listed.png", "cannot identify image file")])
    done, ranks = torchrun(data, tmp_path / "out", "--verify-images", "--bad-files", "skip")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["bad_files"]["count"] == 1 and metrics["train_images"] == 20
    assert all("data version v-43" in ranks[rank] and "decoded in this run" not in ranks[rank] for rank in (0, 1))


def test_five_hundred_bad_files_are_refused_by_one_stage_run_that_lists_them_all(tmp_path):
    """The goal of a data set with 500 bad files: one `trainflow stage` run, the first 20 printed, one error naming
    the count and the list file, exit 2, and nothing staged."""
    data = tmp_path / "data"
    write_imagenet_shaped(data, classes=4, per_class=200, val_per_class=5, progress=False)
    paths = sorted((data / "train").rglob("*.JPEG"))[:500]
    for i, path in enumerate(paths):
        path.chmod(0o644)
        path.write_bytes(path.read_bytes()[:200] if i % 2 else b"not a JPEG at all")
    work = tmp_path / "work"
    done = subprocess.run(
        [TRAINFLOW, "stage", "--data", str(data), "--workdir", str(work)], capture_output=True, text=True, timeout=300
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    listing = next((work / "cache").glob("bad-files-*.tsv"))
    assert re.match(
        rf"error: 500 of 820 images in {re.escape(str(data))} cannot be decoded \(first: .*\); all 500 "
        rf"are listed in {re.escape(str(listing))}",
        errors[0],
    ), errors[0]
    assert done.stderr.count("cannot decode ") == 20 and "... and 480 more" in done.stderr
    assert listed(listing) == {p.relative_to(data).as_posix() for p in paths}
    assert not list(work.rglob("*.JPEG"))  # nothing reached the file server
