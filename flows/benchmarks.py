"""Benchmarks that print numbers: figures are ratios against a baseline measured in the same command."""

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from azure.storage.blob import BlobServiceClient

from rich.console import Console
from rich.progress import Progress, TimeElapsedColumn, track
from rich.table import Table

from flows.config import PipelineConfig
from infra.azurite import connection_string, running_azurite
from infra.blobstore import BlobStore
from infra.build_context import wheel_cache
from infra.fileserver import FileServer
from infra.images import Engine
from infra.launcher import LaunchError, TrainingConfig, engine_argv, train_locally
from infra.local_docker import local_base_image, running_engine, running_registry
from infra.sample_data import write_imagenet_like
from tasks.build_image import build_and_push
from tasks.sync_file_server import sync_to_file_server
from tasks.upload_dataset import upload_dataset

# Small enough for 2 CPU cores; any of these can be set in the config file's training section.
TRAIN_BENCH_DEFAULTS = dict(model="resnet18", image_size=64, batch_size=32, epochs=2, steps_per_epoch=25,
                            warmup_epochs=0, checkpoint_every=0, log_every=5, loader_workers=0)


def bench_training(cfg: PipelineConfig, json_out: Path | None) -> dict:
    """Run 1 and 2 workers under each launcher; print images/s and 2-worker scaling efficiency.

    Every worker gets the same number of threads (cores / 2), so a 2-worker run has twice the
    cores of a 1-worker run and perfect scaling is 2x (efficiency 1.0). The throughput is that of
    the last epoch, so start-up and the first steps' allocations are left out. Two independent
    1-worker runs at once show how much of the shortfall the machine itself causes.
    """
    base = TrainingConfig(**{**TRAIN_BENCH_DEFAULTS, **cfg.training.model_dump(include=cfg.training.model_fields_set)})
    threads = base.threads or max(1, len(os.sched_getaffinity(0)) // 2)
    data, root = cfg.data or "synthetic", cfg.workdir.resolve() / "bench" / "train"
    plan = [(launcher, workers) for launcher in ("horovodrun", "torchrun") for workers in (1, 2)]
    runs = []
    with Progress(*Progress.get_default_columns(), TimeElapsedColumn()) as progress:
        bar = progress.add_task("training benchmark", total=len(plan))
        for launcher, workers in plan:
            progress.update(bar, description=f"{launcher}, {workers} worker(s)")
            run_cfg = base.model_copy(update={"launcher": launcher, "workers": workers, "threads": threads})
            out = root / f"{launcher}-{workers}"
            clear_checkpoints(out)
            metrics = train_locally(run_cfg, data, out, echo=lambda line: None)
            runs.append({"launcher": launcher, "backend": metrics["backend"], "workers": workers,
                         "threads_per_worker": threads, "images_per_sec": metrics["images_per_sec"]})
            progress.console.print(f"{launcher}, {workers} worker(s): {metrics['images_per_sec']:.1f} images/s")
            progress.advance(bar)
    ceiling = independent_throughput(base.model_copy(update={"threads": threads}), data, root / "independent", 2)
    single = min(r["images_per_sec"] for r in runs if r["workers"] == 1)
    result = {"settings": base.model_dump(exclude={"launcher", "workers"}) | {"data": data}, "runs": runs,
              "scaling_efficiency": scaling_efficiency(runs),
              "independent_2x1_images_per_sec": ceiling, "machine_ceiling_efficiency": ceiling / (2 * single)}
    print_training_bench(result)
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def independent_throughput(cfg: TrainingConfig, data: str, root: Path, n: int) -> float:
    """Images/s of n single-process trainings run at once, with no communication between them: the
    most that n workers can get out of this machine's shared caches and memory."""
    procs = []
    for i in range(n):
        out = root / str(i)
        clear_checkpoints(out)
        cmd = [sys.executable, *engine_argv(cfg, data, out), "--backend", "single"]
        procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT), out))
    for proc, _ in procs:
        if proc.wait() != 0:
            raise LaunchError(f"an independent benchmark worker failed; run it alone: {' '.join(cmd)}")
    return sum(json.loads((out / "metrics.json").read_text())["images_per_sec"] for _, out in procs)


def scaling_efficiency(runs: list[dict]) -> dict[str, float]:
    """Per backend: 2-worker images/s / (2 x 1-worker images/s)."""
    by = {(r["backend"], r["workers"]): r["images_per_sec"] for r in runs}
    return {b: by[(b, 2)] / (2 * by[(b, 1)]) for b, w in by if w == 1 and (b, 2) in by}


def clear_checkpoints(out: Path) -> None:
    """A benchmark run starts fresh: an earlier run's checkpoints would be resumed otherwise."""
    for path in (out / "checkpoints").glob("*.pt"):
        path.unlink()


def print_training_bench(result: dict) -> None:
    """A table of the runs and the efficiency per backend."""
    table = Table(title=f"synthetic training: {result['settings']['model']}, {result['settings']['image_size']} px, "
                        f"batch {result['settings']['batch_size']} per worker")
    for column in ("backend", "workers", "threads/worker", "images/s", "scaling efficiency"):
        table.add_column(column, justify="right")
    for r in result["runs"]:
        eff = result["scaling_efficiency"].get(r["backend"]) if r["workers"] == 2 else None
        table.add_row(r["backend"], str(r["workers"]), str(r["threads_per_worker"]), f"{r['images_per_sec']:.1f}",
                      "" if eff is None else f"{eff:.2f}")
    Console().print(table)
    Console().print(f"2 independent 1-worker runs at once (no communication): "
                    f"{result['independent_2x1_images_per_sec']:.1f} images/s, i.e. the machine itself allows "
                    f"an efficiency of {result['machine_ceiling_efficiency']:.2f}")


def bench_staging(cfg: PipelineConfig, json_out: Path | None, files: int, classes: int) -> dict:
    """Stage an ImageNet-like folder through Azurite to the file server, our path against the naive one.

    Naive: one upload_blob per file with SDK defaults, then one download per file to the file server.
    Ours: tar shards uploaded in parallel, manifest, sync. Then an unchanged re-run of ours.
    """
    root = cfg.workdir.resolve() / "bench" / "staging"
    data = Path(cfg.data).resolve() if cfg.data else \
        write_imagenet_like(root / f"imagenet-like-{files}-{classes}", files=files, classes=classes)
    n, size = count_files(data)
    for stale in ("azurite", "work", "naive-export"):
        shutil.rmtree(root / stale, ignore_errors=True)
    with running_azurite(root / "azurite") as port:
        storage = cfg.storage.model_copy(update={"backend": "azurite"})
        phases: dict[str, float] = {}
        ours = time_call(lambda: stage_once(storage, port, data, root / "work", phases))
        rerun = time_call(lambda: stage_once(storage, port, data, root / "work", {}))
        naive = time_call(lambda: naive_staging(port, data, root / "naive-export"))
    result = {"files": n, "bytes": size, "ours_seconds": ours, "naive_seconds": naive, "rerun_seconds": rerun,
              "ours_files_per_s": n / ours, "naive_files_per_s": n / naive, "ours_mb_per_s": size / 1e6 / ours,
              "naive_mb_per_s": size / 1e6 / naive, "speedup": naive / ours, "rerun_fraction": rerun / ours,
              "ours_upload_seconds": phases["upload"], "ours_sync_seconds": phases["sync"],
              "shard_mb": storage.shard_mb}
    print_staging_bench(result)
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def stage_once(storage, port: int, data: Path, work: Path, phases: dict[str, float]) -> None:
    """Our path: upload the data set as shards, then sync it to a file server folder; times each phase."""
    store = BlobStore.connect(storage, connection_string=connection_string(port))
    phases["upload"] = time_call(lambda: upload_dataset(store, storage, data, "bench", work))
    phases["sync"] = time_call(lambda: sync_to_file_server(store, FileServer(work / "fileserver"), "bench", work))


def naive_staging(port: int, data: Path, export: Path) -> None:
    """The baseline: every file its own blob, uploaded then downloaded one at a time, SDK defaults."""
    container = BlobServiceClient.from_connection_string(connection_string(port)).get_container_client("naive")
    container.create_container()
    paths = [p for p in sorted(data.rglob("*")) if p.is_file()]
    for path in track(paths, description="naive upload, one blob per file"):
        with open(path, "rb") as f:
            container.upload_blob(str(path.relative_to(data)), f)
    for path in track(paths, description="naive download to the file server"):
        target = export / path.relative_to(data)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(container.download_blob(str(path.relative_to(data))).readall())


def bench_images(cfg: PipelineConfig, json_out: Path | None) -> dict:
    """A first build and push of the training image against an unchanged rebuild and push, in one command.

    First: every Dockerfile step runs (no layer cache) and the image goes to an empty registry with
    authentication. Second: the same call again, which finds the tag in the registry. The local base
    image (the stand-in for pulling python:3.11-slim with torch) is made before either and not counted.
    """
    root = cfg.workdir.resolve() / "bench" / "images"
    shutil.rmtree(root, ignore_errors=True)
    username, password = "bench", secrets.token_urlsafe(16)
    with running_engine(root / "dockerd"), running_registry(root / "registry", username, password) as host:
        engine = Engine(cfg.image.engine)
        image = cfg.image.model_copy(update={"registry": host, "username": username})
        if image.base_image == "local":
            local_base_image(engine, print)
        first = build_and_push(engine, image, root / "context", wheel_cache(), password, log_quietly, nocache=True)
        second = build_and_push(engine, image, root / "context", wheel_cache(), password, log_quietly)
    result = {"image": first["image"], "first_seconds": first["seconds"], "unchanged_seconds": second["seconds"],
              "unchanged_fraction": second["seconds"] / first["seconds"],
              "unchanged_rebuilt": second["built"], "unchanged_pushed": second["pushed"]}
    table = Table(title=f"training image {cfg.image.flavour}: build and push")
    for column in ("run", "seconds", "built", "pushed"):
        table.add_column(column, justify="right")
    table.add_row("first (no layer cache, empty registry)", f"{first['seconds']:.1f}", str(first["built"]), str(first["pushed"]))
    table.add_row("unchanged context", f"{second['seconds']:.2f}", str(second["built"]), str(second["pushed"]))
    Console().print(table)
    Console().print(f"unchanged context: {result['unchanged_fraction']:.2%} of the first build and push (goal: under 5%)")
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def bench_pipeline(cfg: PipelineConfig, json_out: Path | None) -> dict:
    """The same training job run directly (torchrun on the staged data) and through the whole flow with
    every earlier step cached; prints the flow's overhead as a fraction of the direct run, and each step's time.

    A first flow run stages the data and is not measured."""
    from flows.pipeline import train_pipeline

    root = cfg.workdir.resolve() / "bench" / "pipeline"
    shutil.rmtree(root, ignore_errors=True)
    cfg = cfg.model_copy(update={"workdir": root})
    console = Console()
    console.print("warm-up: the flow once, to stage the data (not measured)")
    staged = train_pipeline(cfg)["steps"][2]["path"]
    console.print("direct: torchrun on the staged data")
    direct = time_call(lambda: train_locally(cfg.training, str(Path(staged).resolve()), root / "direct", lambda _: None))
    console.print("the whole flow, everything before training cached")
    started = time.perf_counter()
    flow = train_pipeline(cfg)
    through_flow = time.perf_counter() - started
    result = {"direct_seconds": direct, "flow_seconds": through_flow, "overhead_fraction": through_flow / direct - 1,
              "step_seconds": flow["step_seconds"], "workers": cfg.training.workers, "model": cfg.training.model,
              "epochs": cfg.training.epochs}
    table = Table(title="the same job, directly and through the flow")
    table.add_column("what")
    table.add_column("seconds", justify="right")
    table.add_row("direct (torchrun)", f"{direct:.1f}")
    table.add_row("whole flow (cached steps)", f"{through_flow:.1f}")
    for step, seconds in flow["step_seconds"].items():
        table.add_row(f"  {step}", f"{seconds:.2f}")
    console.print(table)
    console.print(f"flow overhead: {result['overhead_fraction']:.1%} of the direct run (goal: under 5%)")
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def log_quietly(line: str) -> None:
    """Build output: only the step headers and the push's layer lines, so progress stays readable."""
    if line.startswith(("Step ", "pushing", "pushed", "building")):
        print(line, flush=True)


def count_files(folder: Path) -> tuple[int, int]:
    """Files under a folder and their total size."""
    sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file()]
    return len(sizes), sum(sizes)


def time_call(fn) -> float:
    """Seconds that fn() takes."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def print_staging_bench(r: dict) -> None:
    """The staging figures as a table."""
    table = Table(title=f"staging {r['files']} files, {r['bytes'] / 1e6:.0f} MB, through Azurite to the file server")
    for column in ("path", "seconds", "files/s", "MB/s"):
        table.add_column(column, justify="right")
    table.add_row("naive (blob per file)", f"{r['naive_seconds']:.1f}", f"{r['naive_files_per_s']:.0f}", f"{r['naive_mb_per_s']:.1f}")
    table.add_row("trainflow (shards)", f"{r['ours_seconds']:.1f}", f"{r['ours_files_per_s']:.0f}", f"{r['ours_mb_per_s']:.1f}")
    table.add_row("trainflow, unchanged re-run", f"{r['rerun_seconds']:.2f}", "", "")
    Console().print(table)
    Console().print(f"trainflow phases: upload {r['ours_upload_seconds']:.1f} s, sync {r['ours_sync_seconds']:.1f} s "
                    f"({r['shard_mb']:g} MB shards)\nspeed-up over naive: {r['speedup']:.1f}x; "
                    f"unchanged re-run: {r['rerun_fraction']:.1%} of the first run")
