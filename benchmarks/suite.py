"""`trainflow bench all`: every benchmark at a small size, one after the other, into one JSON and one markdown report
with a plot per benchmark (benchmarks/report.py).

Small by default (minutes each on 2 cores); `tiny` is the size of their tests, to check the whole command quickly.
Training settings the config file names win over these sizes, as in every bench.
"""

from pathlib import Path

from rich.console import Console

from benchmarks.common import machine, over_defaults, write_json
from benchmarks.report import write_report
from flows.config import ConfigError, FlowConfig

# What the flow bench trains: a short job, so that the overhead it measures is the fixed cost's share of minutes.
FLOW_TRAINING = dict(
    model="resnet18", image_size=32, epochs=1, batch_size=16, workers=2, warmup_epochs=0, loader_workers=0
)
SIZES = {
    "small": {
        "loader": dict(files=512),
        "staging": dict(files=500, classes=10),
        "scale": dict(sizes=[1_000, 10_000]),
        "flow": dict(steps_per_epoch=20),
        "train": {},
        "parallel": {},
    },
    "tiny": {
        "loader": dict(files=64),
        "staging": dict(files=40, classes=4),
        "scale": dict(sizes=[300]),
        "flow": dict(steps_per_epoch=2),
        "train": dict(steps_per_epoch=3, batch_size=8, epochs=1),
        "parallel": dict(steps_per_epoch=2, epochs=1),
    },
}
ORDER = ("loader", "staging", "train", "parallel", "flow", "images", "scale")


def bench_all(cfg: FlowConfig, json_out: Path, only: tuple[str, ...] = (), size: str = "small") -> Path:
    """Run the benchmarks `only` names (all by default) at `size`; write their JSON and the report; its path."""
    if unknown := sorted(set(only) - set(ORDER)):
        raise ConfigError(f"--only {unknown[0]} is not a benchmark: pass one of {', '.join(ORDER)}")
    results = {}
    for name in [n for n in ORDER if n in only] or ORDER:
        Console().rule(f"bench {name}")
        results[name] = run_one(name, cfg, SIZES[size].get(name, {}))
    json_out.parent.mkdir(parents=True, exist_ok=True)
    write_json({"size": size, "benches": results}, json_out)
    report = write_report(
        results,
        json_out.with_suffix(".md"),
        f"trainflow bench all --json {json_out.name}"
        + "".join(f" --only {n}" for n in only)
        + (f" --size {size}" if size != "small" else ""),
        machine(),
    )
    Console().print(f"report: {report} (plots beside it); figures: {json_out}")
    return report


def with_training(cfg: FlowConfig, defaults: dict) -> FlowConfig:
    """`cfg` whose training settings are `defaults` where the config file or environment left them unset (the
    others stay unset, so that each bench's own defaults still apply to them)."""
    return cfg.model_copy(update={"training": over_defaults(defaults, cfg.training)})


def run_one(name: str, cfg: FlowConfig, size: dict) -> dict:
    """One benchmark at its size; its figures."""
    if name == "staging":
        from benchmarks.staging import bench_staging

        return bench_staging(cfg, None, size["files"], size["classes"])
    if name == "loader":
        from benchmarks.loader import bench_loader

        return bench_loader(cfg, None, size["files"])
    if name == "scale":
        from benchmarks.scale import bench_scale

        return bench_scale(cfg, size["sizes"], None)
    if name == "images":
        from benchmarks.images import bench_images

        return bench_images(cfg, None)
    if name == "flow":
        from benchmarks.overhead import bench_flow
        from flows.cli import with_data

        return bench_flow(with_data(with_training(cfg, {**FLOW_TRAINING, **size})), None)
    if name == "train":
        from benchmarks.training import bench_training

        return bench_training(with_training(cfg, size), None)
    from benchmarks.parallel import bench_parallel

    return bench_parallel(with_training(cfg, size), None)
