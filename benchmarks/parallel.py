"""`trainflow bench parallel`: data parallelism against pipeline parallelism for one model and global batch.

Data-parallel: 2 workers, each with half the global batch and the whole model. Pipeline: the model split
into 2 stages over 2 workers, the whole global batch in M = 1, 2, 4, 8 micro-batches, then into 4 stages
over 4 workers with M = 4. Every run has the same threads per worker; images/s are given as a ratio to
the data-parallel run (the 4-stage run has twice the processes on the same cores); images/s is the steady
rate (after the first step, which also infers shapes and allocates), as in every bench. Each configuration
runs REPEATS times, the repetitions interleaved, and every figure is the median with its min-max.
Memory is per rank: the parameters it holds, its peak memory (its own peak resident set on CPU, allocated
memory on GPU) and the part of that peak its training added (on CPU the peak above the resident set before
the model was built: the runtime every process carries is left out, as CUDA's allocated memory leaves out
the context), each beside the largest rank's figure as a share of the data-parallel worker's. The pipeline's idle
("bubble") fraction is measured in training, per stage, as 1 - (time inside the stage's forward and
backward passes) / (step time), averaged over the stages, beside GPipe's (S - 1) / (M + S - 1) for
equal stages; the measured figure also holds the sends and receives and any imbalance between stages.
"""

from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import REPEATS
from benchmarks.common import bench_progress, clear_checkpoints, shown, spread, write_json
from flows.config import FlowConfig
from infra.compute.process import train_here
from infra.engines.contract import Metrics
from infra.engines.pytorch import PyTorchTraining
from nodelib.cores import usable_cores

# Small enough for 2 CPU cores; the config file's training section overrides any of these.
PARALLEL_BENCH_DEFAULTS = dict(
    model="resnet18",
    image_size=64,
    batch_size=32,
    epochs=1,
    steps_per_epoch=12,
    warmup_epochs=0,
    checkpoint_every=0,
    log_every=4,
    loader_workers=0,
    balance="time",
    launcher="torchrun",
)
MICROBATCHES = (1, 2, 4, 8)


def planned_runs(
    base: PyTorchTraining, microbatches: tuple[int, ...] = MICROBATCHES
) -> list[tuple[str, PyTorchTraining]]:
    """(label, settings) of each run: data-parallel on 2 workers, then the 2-stage pipelines."""
    data = base.model_copy(
        update={"workers": 2, "parallel": "data", "stages": 1, "microbatches": 1, "batch_size": base.batch_size // 2}
    )
    pipes = [(f"pipeline M={m}", pipeline(base, 2, m)) for m in microbatches]
    return [("data-parallel", data), *pipes]


def deeper_runs(base: PyTorchTraining) -> list[tuple[str, PyTorchTraining]]:
    """The 4-stage pipeline (4 workers, M = 4): how memory per rank falls with more stages."""
    return [("4 stages M=4", pipeline(base, 4, 4))]


def pipeline(base: PyTorchTraining, stages: int, microbatches: int) -> PyTorchTraining:
    """`base` as one pipeline replica of `stages` workers."""
    return base.model_copy(
        update={"workers": stages, "parallel": "pipeline", "stages": stages, "microbatches": microbatches}
    )


def bench_parallel(
    cfg: FlowConfig, json_out: Path | None, microbatches: tuple[int, ...] = MICROBATCHES, repeats: int = REPEATS
) -> dict:
    """Run every planned configuration `repeats` times on synthetic data; print and return the figures."""
    base = PyTorchTraining(
        **{**PARALLEL_BENCH_DEFAULTS, **cfg.training.model_dump(include=cfg.training.model_fields_set)}
    )
    base = base.model_copy(update={"threads": base.threads or max(1, usable_cores() // 2)})
    root, plan = cfg.workdir.resolve() / "bench" / "parallel", planned_runs(base, microbatches) + deeper_runs(base)
    results: dict[str, list[Metrics]] = {label: [] for label, _ in plan}
    with bench_progress() as progress:
        bar = progress.add_task("parallelism benchmark", total=len(plan) * repeats)
        for repeat in range(repeats):  # interleaved: a slow spell of the machine touches every configuration
            for label, run_cfg in plan:
                progress.update(bar, description=f"{label} ({repeat + 1}/{repeats})")
                out = root / label.replace(" ", "-").replace("=", "")
                clear_checkpoints(out)
                results[label].append(train_here(run_cfg, "synthetic", out, root / "pools", lambda line: None))
                progress.advance(bar)
    rows = compared([row(label, run_cfg, results[label]) for label, run_cfg in plan])
    result = {
        "settings": base.model_dump(exclude={"workers", "parallel", "stages", "microbatches"})
        | {"global_batch": base.batch_size, "repeats": repeats},
        "runs": rows,
    }
    print_parallel_bench(result)
    write_json(result, json_out)
    return result


def row(label: str, cfg: PyTorchTraining, runs: list[Metrics]) -> dict:
    """One configuration's figures over its repetitions, from their metrics.json."""
    facts = [m.to_json() for m in runs]
    pipeline = facts[0].get("pipeline") or {}
    return {
        "run": label,
        "workers": cfg.workers,
        "stages": cfg.stages,
        "microbatches": cfg.microbatches,
        "images_per_sec": spread([f["steady_images_per_sec"] for f in facts]),
        "parameters_per_rank": facts[0].get("parameters_per_rank"),
        "peak_memory_mb_per_rank": per_rank(facts, "peak_memory_mb"),
        "training_memory_mb_per_rank": per_rank(facts, "training_memory_mb"),
        "idle_measured": spread([f["pipeline"]["idle_fraction_measured"] for f in facts]) if pipeline else None,
        "idle_theoretical": pipeline.get("idle_fraction_theoretical"),
        "split": pipeline.get("split"),
    }


def per_rank(facts: list[dict], key: str) -> list[dict]:
    """The spread of each rank's `key` over the repetitions."""
    return [spread(list(rank)) for rank in zip(*(f[key] for f in facts))]


def compared(rows: list[dict]) -> list[dict]:
    """Each row with its median images/s and its largest rank's median peak memory, whole and the part training
    added, as shares of the data-parallel run's (the first row)."""
    speed, memory = rows[0]["images_per_sec"]["median"], largest(rows[0], "peak_memory_mb_per_rank")
    training = largest(rows[0], "training_memory_mb_per_rank")
    return [
        {
            **r,
            "vs_data_parallel": r["images_per_sec"]["median"] / speed,
            "memory_vs_data_parallel": largest(r, "peak_memory_mb_per_rank") / memory,
            "training_memory_vs_data_parallel": largest(r, "training_memory_mb_per_rank") / training,
        }
        for r in rows
    ]


def largest(r: dict, key: str) -> float:
    """The median memory figure `key` of the rank that needs the most."""
    return max(rank["median"] for rank in r[key])


def print_parallel_bench(result: dict) -> None:
    """The runs as a table: medians, with min-max in brackets."""
    s = result["settings"]
    table = Table(
        title=f"{s['model']}, {s['image_size']} px, global batch {s['global_batch']}, {s['threads']} "
        f"thread(s) per worker, synthetic data, median (min-max) of {s['repeats']} runs"
    )
    for column in (
        "run",
        "images/s",
        "vs data-parallel",
        "M params per rank",
        "peak MB per rank",
        "largest peak vs data-parallel",
        "training MB per rank",
        "largest training vs data-parallel",
        "idle measured",
        "idle theory",
    ):
        table.add_column(column, justify="right")
    for r in result["runs"]:
        idle = "" if r["idle_measured"] is None else shown(r["idle_measured"], ".2f")
        theory = "" if r["idle_theoretical"] is None else f"{r['idle_theoretical']:.2f}"
        params = " / ".join(f"{p / 1e6:.1f}" for p in r["parameters_per_rank"] or [])
        memory, training = (
            " / ".join(shown(m, ".0f") for m in r[key])
            for key in ("peak_memory_mb_per_rank", "training_memory_mb_per_rank")
        )
        table.add_row(
            r["run"],
            shown(r["images_per_sec"], ".1f"),
            f"{r['vs_data_parallel']:.2f}",
            params,
            memory,
            f"{r['memory_vs_data_parallel']:.2f}",
            training,
            f"{r['training_memory_vs_data_parallel']:.2f}",
            idle,
            theory,
        )
    Console().print(table)
