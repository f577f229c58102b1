"""`trainflow bench parallel`: data parallelism against pipeline parallelism for one model and global batch.

Data-parallel: 2 workers, each with half the global batch and the whole model. Pipeline: the model split
into 2 stages over 2 workers, the whole global batch in M = 1, 2, 4, 8 micro-batches. Every run has the
same workers and threads, so images/s are comparable; each is also given as a ratio to the data-parallel
run of the same command. Peak memory is per worker (resident set on CPU, allocated memory on GPU). The
pipeline's idle ("bubble") fraction is measured in training, per stage, as 1 - (time inside the stage's
forward and backward passes) / (step time), averaged over the stages, beside GPipe's (S - 1) / (M + S - 1)
for equal stages; the measured figure also holds the sends and receives and any imbalance between stages.
"""

import os
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, TimeElapsedColumn
from rich.table import Table

from flows.bench.common import clear_checkpoints, write_json
from flows.config import FlowConfig
from infra.backends.process import train_here
from infra.trainer import TrainingConfig, TrainingMetrics

# Small enough for 2 CPU cores; the config file's training section overrides any of these.
PARALLEL_BENCH_DEFAULTS = dict(model="resnet18", image_size=64, batch_size=32, epochs=1, steps_per_epoch=12,
                               warmup_epochs=0, checkpoint_every=0, log_every=4, loader_workers=0,
                               balance="time", launcher="torchrun")
MICROBATCHES = (1, 2, 4, 8)


def planned_runs(base: TrainingConfig) -> list[tuple[str, TrainingConfig]]:
    """(label, settings) of each run: data-parallel on 2 workers, then the 2-stage pipelines."""
    data = base.model_copy(update={"workers": 2, "parallel": "data", "stages": 1, "microbatches": 1,
                                   "batch_size": base.batch_size // 2})
    pipes = [(f"pipeline M={m}", base.model_copy(update={"workers": 2, "parallel": "pipeline", "stages": 2,
                                                         "microbatches": m})) for m in MICROBATCHES]
    return [("data-parallel", data), *pipes]


def bench_parallel(cfg: FlowConfig, json_out: Path | None) -> dict:
    """Run every planned configuration on synthetic data; print and return the figures."""
    base = TrainingConfig(**{**PARALLEL_BENCH_DEFAULTS, **cfg.training.model_dump(include=cfg.training.model_fields_set)})
    base = base.model_copy(update={"threads": base.threads or max(1, len(os.sched_getaffinity(0)) // 2)})
    root, rows = cfg.workdir.resolve() / "bench" / "parallel", []
    plan = planned_runs(base)
    with Progress(*Progress.get_default_columns(), TimeElapsedColumn()) as progress:
        bar = progress.add_task("parallelism benchmark", total=len(plan))
        for label, run_cfg in plan:
            progress.update(bar, description=label)
            out = root / label.replace(" ", "-").replace("=", "")
            clear_checkpoints(out)
            rows.append(row(label, run_cfg, train_here(run_cfg, "synthetic", out, root / "pools", lambda line: None)))
            progress.advance(bar)
    for r in rows:
        r["vs_data_parallel"] = r["images_per_sec"] / rows[0]["images_per_sec"]
    result = {"settings": base.model_dump(exclude={"workers", "parallel", "stages", "microbatches"}) |
              {"global_batch": base.batch_size}, "runs": rows}
    print_parallel_bench(result)
    write_json(result, json_out)
    return result


def row(label: str, cfg: TrainingConfig, metrics: TrainingMetrics) -> dict:
    """One run's figures from its metrics.json."""
    pipeline = metrics.pipeline or {}
    return {"run": label, "microbatches": cfg.microbatches, "images_per_sec": metrics.images_per_sec,
            "peak_memory_mb_per_worker": metrics.peak_memory_mb,
            "idle_measured": pipeline.get("idle_fraction_measured"),
            "idle_theoretical": pipeline.get("idle_fraction_theoretical"), "split": pipeline.get("split")}


def print_parallel_bench(result: dict) -> None:
    """The runs as a table."""
    s = result["settings"]
    table = Table(title=f"{s['model']}, {s['image_size']} px, global batch {s['global_batch']}, 2 workers x "
                        f"{s['threads']} threads, synthetic data")
    for column in ("run", "images/s", "vs data-parallel", "peak MB per worker", "idle measured", "idle theory"):
        table.add_column(column, justify="right")
    for r in result["runs"]:
        idle = "" if r["idle_measured"] is None else f"{r['idle_measured']:.2f}"
        theory = "" if r["idle_theoretical"] is None else f"{r['idle_theoretical']:.2f}"
        memory = " / ".join(f"{m:.0f}" for m in r["peak_memory_mb_per_worker"])
        table.add_row(r["run"], f"{r['images_per_sec']:.1f}", f"{r['vs_data_parallel']:.2f}", memory, idle, theory)
    Console().print(table)
