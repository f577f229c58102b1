"""`trainflow bench scale`: how each staging stage's cost grows with the number of files (ImageNet has 1.33 million).

For each size, an ImageNet-shaped folder of small JPEGs is staged through this repo's Azurite to a local file server,
and every stage runs in a process of its own so that its wall time and its peak memory (RSS) are its own: the first
upload (list + hash + check, pack + upload, manifest), the first sync, an unchanged re-run, a re-run after one file
changed, one after 1% of the files changed, and the start-up of `trainflow train` on the synced version (from the
command to the first training step).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from benchmarks.common import write_json
from flows.config import FlowConfig
from infra.data.sample_data import write_imagenet_shaped
from infra.services.azurite import connection_string, running_azurite
from infra.storage.blobstore import BlobStore
from infra.storage.fileserver import FileServer
from tasks.sync_file_server import sync_to_file_server
from tasks.upload_dataset import upload_dataset
from trainer.memory import peak_resident_mb

NAME = "scale"
STAGES = ("first", "unchanged", "one changed", "1% changed")
TRAIN_YAML = """training:
  model: resnet18
  image_size: 32
  batch_size: 8
  epochs: 1
  log_every: 1
  checkpoint_every: 0
  loader_workers: 1
  workers: 2
"""


def shape(files: int) -> tuple[int, int, int]:
    """Classes, train and val images per class of an ImageNet-shaped set of about `files` files (1,281 + 50 per
    class, up to 1,000 classes)."""
    classes = max(2, min(1000, round(files / 1331)))
    per_class = max(2, round(files / classes * 1281 / 1331))
    return classes, per_class, max(1, round(files / classes) - per_class)


def bench_scale(cfg: FlowConfig, json_out: Path | None, sizes: list[int]) -> dict:
    """Every stage at every size; prints one table and writes the JSON."""
    root = cfg.workdir.resolve() / "bench" / "scale"
    points = [measure_size(cfg, root, files) for files in sizes]
    result = {"points": points}
    print_scale_table(points)
    write_json(result, json_out)
    return result


def measure_size(cfg: FlowConfig, root: Path, files: int) -> dict:
    """One size: generate (or keep) the folder, then run and measure each stage."""
    classes, per_class, val = shape(files)
    data = root / f"data-{classes}x{per_class}+{val}"
    count = write_imagenet_shaped(data, classes, per_class, val)["files"]
    work = root / f"work-{files}"
    shutil.rmtree(work, ignore_errors=True)
    stages = {}
    with running_azurite(work / "azurite") as port:
        for stage in STAGES:
            touched = change_files(data, stage)
            stages[stage] = run_stage(cfg, data, work, port)
            stages[stage]["files changed"] = touched
    stages["training start-up"] = training_startup(work / "fileserver" / "datasets" / NAME / "current", work)
    return {"files": count, "classes": classes, "stages": stages}


def change_files(data: Path, stage: str) -> int:
    """Rewrite the files a stage changes (none, one, or 1%): new bytes, still valid JPEGs."""
    if stage in ("first", "unchanged"):
        return 0
    paths = sorted((data / "train").rglob("*.JPEG"))
    chosen = paths[:1] if stage == "one changed" else paths[::100]
    for path in chosen:
        raw = path.read_bytes()
        comment = f"changed {time.time_ns()}".encode()
        path.chmod(0o644)
        path.write_bytes(raw[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + raw[2:])
    return len(chosen)


def run_stage(cfg: FlowConfig, data: Path, work: Path, port: int) -> dict:
    """Upload then sync in a fresh process; its phases, wall time and peak RSS."""
    storage = cfg.storage.model_copy(update={"backend": "azurite"})
    args = json.dumps({"storage": storage.model_dump(mode="json"), "data": str(data), "work": str(work), "port": port})
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scale", args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench stage failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def stage_in_this_process(args: dict) -> dict:
    """What `run_stage` runs: the upload and the sync, timed by phase, with this process's peak RSS."""
    from infra.storage.config import StorageConfig

    storage = StorageConfig.model_validate(args["storage"])
    store = BlobStore.connect(storage, connection_string=connection_string(args["port"]))
    work = Path(args["work"])
    started = time.perf_counter()
    upload = upload_dataset(store, storage, Path(args["data"]), NAME, work)
    middle = time.perf_counter()
    sync, _ = sync_to_file_server(store, FileServer(work / "fileserver"), NAME, work)
    ended = time.perf_counter()
    return {
        "upload_s": middle - started,
        "sync_s": ended - middle,
        "seconds": ended - started,
        "phases": {
            **{f"upload: {k}": v for k, v in upload.phases.items()},
            **{f"sync: {k}": v for k, v in sync.phases.items()},
        },
        "uploaded files": upload.files,
        "fetched files": sync.files,
        "peak_rss_mb": peak_resident_mb(),
    }


def training_startup(data: Path, work: Path) -> dict:
    """Seconds from `trainflow train` to its first training step on the synced version, and the peak RSS of the
    orchestrator's process and of the largest rank (sampled every 0.1 s); the run is then interrupted."""
    config = work / "train.yaml"
    config.write_text(TRAIN_YAML)
    cmd = [
        str(Path(sys.executable).with_name("trainflow")),
        "train",
        "--config",
        str(config),
        "--data",
        str(data),
        "--workdir",
        str(work / "train"),
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    peaks, done = {"orchestrator": 0.0, "largest other": 0.0}, threading.Event()
    threading.Thread(target=sample_rss, args=(proc.pid, peaks, done), daemon=True).start()
    first, lines = None, []
    assert proc.stdout is not None  # stdout=PIPE
    for line in proc.stdout:
        lines.append(line)
        if " step 1 (" in line:
            first = time.perf_counter() - started
            break
    done.set()
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=120)
    if first is None:
        raise RuntimeError(f"training never reached its first step:\n{''.join(lines[-30:])}")
    return {"seconds": first, "peak_rss_mb": peaks["orchestrator"], "largest_other_rss_mb": peaks["largest other"]}


def sample_rss(pid: int, peaks: dict, done: threading.Event) -> None:
    """Keep the peak RSS (MB) of process `pid` and of the largest of its descendants until `done`."""
    root = psutil.Process(pid)
    while not done.wait(0.1):
        try:
            peaks["orchestrator"] = max(peaks["orchestrator"], root.memory_info().rss / 2**20)
            others = [c.memory_info().rss for c in root.children(recursive=True)]
        except psutil.Error:
            continue
        peaks["largest other"] = max(peaks["largest other"], max(others, default=0) / 2**20)


def print_scale_table(points: list[dict]) -> None:
    """Seconds, microseconds per file and peak RSS of every stage at every size."""
    table = Table(title="staging and training start-up as the data set grows (this repo's Azurite, local file server)")
    table.add_column("stage")
    for p in points:
        table.add_column(f"{p['files']:,} files: s", justify="right")
        table.add_column("µs/file", justify="right")
        table.add_column("peak MB", justify="right")
    for stage in (*STAGES, "training start-up"):
        for phase in [None, *points[0]["stages"][stage].get("phases", {})]:
            cells = []
            for p in points:
                s = p["stages"][stage]
                seconds = s["phases"][phase] if phase else s["seconds"]
                cells += [
                    f"{seconds:.2f}",
                    f"{seconds / p['files'] * 1e6:.1f}",
                    "" if phase else f"{s['peak_rss_mb']:.0f}",
                ]
            table.add_row(f"  {phase}" if phase else stage, *cells)
    Console().print(table)


if __name__ == "__main__":
    print(json.dumps(stage_in_this_process(json.loads(sys.argv[1]))))
