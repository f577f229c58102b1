"""Benchmarks that print numbers: figures are ratios against a baseline measured in the same command."""

import json
import os
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, TimeElapsedColumn
from rich.table import Table

from flows.config import PipelineConfig
from infra.launcher import TrainingConfig, train_locally

# Small enough for 2 CPU cores; any of these can be set in the config file's training section.
TRAIN_BENCH_DEFAULTS = dict(model="resnet18", image_size=64, batch_size=32, epochs=2, steps_per_epoch=15,
                            warmup_epochs=0, checkpoint_every=0, log_every=5, loader_workers=0)


def bench_training(cfg: PipelineConfig, json_out: Path | None) -> dict:
    """Run 1 and 2 workers under each launcher; print images/s and 2-worker scaling efficiency.

    Every worker gets the same number of threads (cores / 2), so a 2-worker run has twice the
    cores of a 1-worker run and perfect scaling is 2x (efficiency 1.0). The throughput is that of
    the last epoch, so start-up and the first steps' allocations are left out.
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
    result = {"settings": base.model_dump(exclude={"launcher", "workers"}) | {"data": data}, "runs": runs,
              "scaling_efficiency": scaling_efficiency(runs)}
    print_training_bench(result)
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    return result


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
