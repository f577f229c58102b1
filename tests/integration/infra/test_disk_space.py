"""A full disk, for real, on small tmpfs mounts: every writer ends in one line naming the path, the bytes it needed
and the bytes free, removes its partial file and keeps the previous complete one; staging whose need is known is
refused before anything starts (infra/core/diskspace.py, nodelib/errors.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nodelib
from infra.core.diskspace import DiskFull, check_prefect_space
from infra.core.jsonfiles import write_json
from infra.data import manifest as mf
from tests.fakes.image_files import write_image
from trainer import checkpoint

pytestmark = pytest.mark.integration
TRAINFLOW = str(Path(sys.executable).parent / "trainflow")


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh tmpfs of `size` (e.g. "64k") under tmp_path; unmounted after the test."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"disk-{len(mounted)}"
        folder.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


def fill(disk: Path, leave: int) -> None:
    """Fill `disk` until `leave` bytes are free."""
    import shutil

    free = shutil.disk_usage(disk).free
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave))


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The digits data set (1,797 small PNGs, 1.2 MB; 7.5 MB on a disk of 4 kB blocks)."""
    data = tmp_path_factory.mktemp("digits") / "digits"
    subprocess.run([TRAINFLOW, "data", "digits", "--data", str(data)], check=True, capture_output=True)
    return data


@pytest.mark.parametrize("size", ["3m", "6m", "12m"])
def test_staging_on_a_disk_too_small_is_refused_in_one_line_before_anything_starts(tmpfs, digits, size):
    """Before: after 64-90 s, a traceback ending in `sqlite3.OperationalError: database or disk is full` (6 MB,
    20 MB), or Prefect's server exiting at start-up (3 MB); cache/index-*.sqlite left behind."""
    work = tmpfs(size) / "w"
    result = subprocess.run(
        [TRAINFLOW, "stage", "--data", str(digits), "--workdir", str(work)], capture_output=True, text=True, timeout=120
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr[-2000:]
    assert lines[0].startswith(f"error: no space for staging digits on the disk of {work}: it needs "), lines[0]
    assert "the file server's copy 7." in lines[0] and "Prefect's database 6.0 MB" in lines[0], lines[0]
    assert "free there; free " in lines[0] and lines[0].endswith("or pass --workdir on a bigger disk"), lines[0]
    assert not work.exists() or sorted(p.name for p in work.iterdir()) == []  # nothing started, nothing written


def test_staging_that_fits_is_not_refused(tmpfs, digits):
    """The same data set on a 20 MB disk: the check lets it start and staging ends whole (12.5 MB used)."""
    work = tmpfs("20m") / "w"
    result = subprocess.run(
        [TRAINFLOW, "stage", "--data", str(digits), "--workdir", str(work)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (work / "fileserver" / "datasets" / "digits" / "current" / ".manifest.jsonl").is_file()


def test_a_full_disk_under_mlflow_s_store_is_one_line_naming_it(tmpfs):
    """Before: MLflow's exception, wrapping SQLAlchemy's "database or disk is full", with its traceback. (In a process
    of its own: MLflow keeps its store's database open while the process lives.)"""
    work = tmpfs("300k") / "w"
    code = (
        "import sys; from pathlib import Path; from infra.runs.tracking import TrackingConfig, start_run\n"
        "try: start_run(TrackingConfig(), Path(sys.argv[1]), 'r', {'a': 1}, {})\n"
        "except Exception as exc: print(type(exc).__name__, exc)"
    )
    result = subprocess.run([sys.executable, "-c", code, str(work)], capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith(f"DiskFull no space left on the disk of {work / 'mlflow'}: the disk filled while")


def test_a_full_disk_during_the_index_keeps_the_last_complete_index(tmpfs, tmp_path):
    """Before: `sqlite3.OperationalError: database or disk is full` at a COMMIT, and the index left behind."""
    data = tmp_path / "data"
    for i in range(40):
        write_image(data / "train" / "ab"[i % 2] / f"{i:04d}.png")
    cache = tmpfs("160k") / "cache" / "index-d.sqlite"
    with mf.scanned(data, cache, lambda paths: [], keep=True):
        pass
    before = cache.read_bytes()
    for i in range(40, 2500):  # a bigger data set, whose index the disk cannot hold
        (data / "train" / "a" / f"{i:04d}.png").write_bytes(b"x")
    with pytest.raises(DiskFull) as full, mf.scanned(data, cache, lambda paths: [], keep=True):
        pass
    assert str(full.value).startswith(f"no space left on the disk of {cache}: writing it needs more than "), full
    assert " free there; " in str(full.value)
    assert cache.read_bytes() == before  # the previous complete index
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name]  # no partial index folder


def test_a_full_disk_keeps_the_previous_json_file_and_no_partial_one(tmpfs):
    """Before: the OSError's traceback, and the half-written .tmp file left beside the ledger."""
    disk = tmpfs("64k")
    write_json(disk / "ledger.json", {"steps": [1]})
    fill(disk, 4096)
    with pytest.raises(DiskFull, match=f"^no space left on the disk of {disk / 'ledger.json'}: writing it needs 20"):
        write_json(disk / "ledger.json", {"steps": ["x" * 20_000]})
    assert json.loads((disk / "ledger.json").read_text()) == {"steps": [1]}
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "ledger.json"]


def test_a_shard_that_does_not_fit_is_refused_first_and_a_partial_one_removed(tmpfs, tmp_path):
    """Before: the tar's OSError with its traceback, the partial tar left in the workdir's tmp/."""
    disk = tmpfs("64k")
    entries = []
    for i in range(30):
        path = write_image(tmp_path / "data" / "train" / "a" / f"{i}.png")
        entries.append(mf.FileEntry(f"train/a/{i}.png", path.stat().st_size, mf.sha256_file(path)))
    todo = {"s1": (30, sum(e.size for e in entries))}
    with pytest.raises(DiskFull, match=f"^no space for the shards on the disk of {disk}: it needs .* free there"):
        mf.check_shard_space(disk, {**todo, "s2": (30, 60_000)}, 2)
    mf.check_shard_space(disk, todo, 1)  # one fits
    fill(disk, 8192)
    with pytest.raises(DiskFull, match="writing it needs more than the"):
        mf.write_shard(tmp_path / "data", entries, disk / "shard.tar")
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]


def test_prefect_is_not_started_where_its_database_cannot_fit(tmpfs):
    """Before: "Prefect's server exited with status 3 at start-up", its log empty on the full disk."""
    home = tmpfs("3m") / "prefect"
    with pytest.raises(DiskFull, match=rf"^no space for Prefect's server on the disk of {home}: it needs 6.0 MB"):
        check_prefect_space(home)
    assert not home.exists()


def state(mb: float) -> dict:
    return {"model": {"w": torch.ones(int(mb * 1e6 / 4))}, "step": 1}


def test_a_checkpoint_that_does_not_fit_is_refused_and_the_last_good_one_stays(tmpfs):
    """Before: torch's RuntimeError ("unexpected pos ...") with a traceback, a torn .tmp file left."""
    folder = tmpfs("3m") / "checkpoints"
    first = checkpoint.save_checkpoint(folder, state(1), 1)
    with pytest.raises(DiskFull) as full:
        checkpoint.save_checkpoint(folder, state(2.5), 2)
    line = str(full.value)
    assert line.startswith(f"no space left on the disk of {folder / 'step-000000002.pt'}: writing it needs 2.5 MB")
    assert "a re-run resumes from the newest checkpoint" in line, line
    assert sorted(p.name for p in folder.iterdir()) == [first.name]
    assert torch.equal(checkpoint.load_checkpoint(first)["model"]["w"], state(1)["model"]["w"])


def test_a_disk_that_fills_during_a_write_removes_the_partial_file(tmpfs):
    """A write whose size is not known up front (metrics.json, a Keras model): the disk fills mid-write."""
    disk = tmpfs("64k")
    checkpoint.save_json(disk / "metrics.json", {"status": "running"})
    with pytest.raises(DiskFull, match="writing it needs more than the .* it had written, .* free there"):
        checkpoint.write_atomic(disk / "metrics.json", lambda p: p.write_bytes(b"x" * 200_000))
    assert json.loads((disk / "metrics.json").read_text()) == {"status": "running"}
    assert sorted(p.name for p in disk.iterdir()) == ["metrics.json"]


def test_training_whose_disk_fills_ends_in_one_line_with_the_last_checkpoint_whole(tmpfs, tmp_path):
    """`trainflow train` with --out on an 8 MB disk: squeezenet1_1's first checkpoint (5.8 MB) fits, the second does
    not. Before: torch's RuntimeError ("unexpected pos ...") as the rank's traceback, a torn .tmp file left."""
    for i in range(16):
        write_image(tmp_path / "data" / "train" / "ab"[i % 2] / f"{i}.png")
    out = tmpfs("8m") / "run"
    result = subprocess.run(
        [TRAINFLOW, "train", "--data", str(tmp_path / "data"), "--model", "squeezenet1_1", "--epochs", "2"]
        + ["--workers", "1", "--batch-size", "4", "--out", str(out), "--workdir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=400,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr[-2000:]
    assert lines[0].startswith(f"error: rank 0 failed: no space left on the disk of {out}/checkpoints/step-"), lines
    assert "writing it needs 5.8 MB" in lines[0] and "a re-run resumes from the newest checkpoint" in lines[0]
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == ["step-000000004.pt"], kept  # no partial file beside it
    assert checkpoint.load_checkpoint(out / "checkpoints" / kept[0])["step"] == 4


def staged_folder(data: Path, dest: Path) -> Path:
    """`data` staged as a datastore folder holds it: manifest.jsonl and shards/<id>.tar (one shard)."""
    with mf.scanned(data, dest / "index.sqlite", lambda paths: [], keep=False) as (index, _):
        files, nbytes = index.total()
        header = {"format": mf.FORMAT, "dataset": "d", "version": index.plan_shards(1), "shard_count": 1}
        (dest / "shards").mkdir(parents=True)
        for sid in index.shards.values():
            mf.write_shard(data, index.shard_files(sid), dest / "shards" / f"{sid}.tar")
        mf.write_manifest(index, {**header, "files": files, "bytes": nbytes}, dest / "manifest.jsonl")
    return dest


def test_the_node_side_fetch_to_a_full_disk_is_refused_in_one_line_and_leaves_no_version(tmpfs, tmp_path):
    """nodelib/staged/fetch.py on a node, its export too small. Before: "error: cannot write to EXPORT: it is full", no
    bytes, and only once the disk had filled."""
    for i in range(40):
        write_image(tmp_path / "data" / "train" / "ab"[i % 2] / f"{i}.png")
    source, export = staged_folder(tmp_path / "data", tmp_path / "staged"), tmpfs("128k")
    script = Path(nodelib.__file__).parent / "staged" / "fetch.py"
    result = subprocess.run(
        [sys.executable, str(script), "--source", str(source), "--export", str(export), "--dataset", "d"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: no space left on the disk of {export}/datasets/d: writing it needs 16"), (
        result.stderr
    )
    assert "(fileserver_export, or --workdir)" in result.stderr, result.stderr
    assert sorted(p.name for p in (export / "datasets" / "d").iterdir()) == []  # no partial version
