"""`trainflow bench train`: synthetic throughput with 1 and 2 workers per launcher, and the scaling efficiency."""

import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, TimeElapsedColumn
from rich.table import Table

from flows.bench.common import clear_checkpoints, write_json
from flows.config import FlowConfig
from infra.backends.process import train_here
from infra.launchers import LaunchError
from infra.trainer import TrainingConfig, read_metrics, trainer_argv

# Small enough for 2 CPU cores; any of these can be set in the config file's training section.
TRAIN_BENCH_DEFAULTS = dict(model="resnet18", image_size=64, batch_size=32, epochs=2, steps_per_epoch=25,
                            warmup_epochs=0, checkpoint_every=0, log_every=5, loader_workers=0)


def bench_training(cfg: FlowConfig, json_out: Path | None) -> dict:
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
            metrics = train_here(run_cfg, data, out, root / "pools", lambda line: None)
            runs.append({"launcher": launcher, "backend": metrics.backend, "workers": workers,
                         "threads_per_worker": threads, "images_per_sec": metrics.images_per_sec})
            progress.console.print(f"{launcher}, {workers} worker(s): {metrics.images_per_sec:.1f} images/s")
            progress.advance(bar)
    ceiling = independent_throughput(base.model_copy(update={"threads": threads}), data, root / "independent", 2)
    single = min(r["images_per_sec"] for r in runs if r["workers"] == 1)
    result = {"settings": base.model_dump(exclude={"launcher", "workers"}) | {"data": data}, "runs": runs,
              "scaling_efficiency": scaling_efficiency(runs),
              "independent_2x1_images_per_sec": ceiling, "machine_ceiling_efficiency": ceiling / (2 * single)}
    print_training_bench(result)
    write_json(result, json_out)
    return result


def independent_throughput(cfg: TrainingConfig, data: str, root: Path, n: int) -> float:
    """Images/s of n single-process trainings run at once, with no communication between them: the
    most that n workers can get out of this machine's shared caches and memory."""
    procs = []
    for i in range(n):
        out = root / str(i)
        clear_checkpoints(out)
        cmd = [sys.executable, *trainer_argv(cfg, data, out), "--backend", "single"]
        procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT), out))
    for proc, _ in procs:
        if proc.wait() != 0:
            raise LaunchError(f"an independent benchmark worker failed; run it alone: {' '.join(cmd)}")
    return sum(read_metrics(out).images_per_sec for _, out in procs)


def scaling_efficiency(runs: list[dict]) -> dict[str, float]:
    """Per backend: 2-worker images/s / (2 x 1-worker images/s)."""
    by = {(r["backend"], r["workers"]): r["images_per_sec"] for r in runs}
    return {b: by[(b, 2)] / (2 * by[(b, 1)]) for b, w in by if w == 1 and (b, 2) in by}


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
