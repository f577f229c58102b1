"""`trainflow bench all`: every benchmark at a small size, one after the other, into one JSON and one markdown report
with a plot per benchmark (benchmarks/report.py).

Small by default (minutes each on 2 cores); `tiny` is the size of their tests, to check the whole command quickly.
Training settings the config file names win over these sizes, as in every bench.
"""

from pathlib import Path
from pkgutil import resolve_name
from typing import Any

from rich.console import Console

from benchmarks import BENCHES
from benchmarks.common import machine, over_defaults, write_json
from benchmarks.report import write_report
from flows.config import ConfigError, FlowConfig

# What the flow bench trains: a short job, so that the overhead it measures is the fixed cost's share of minutes.
FLOW_TRAINING = dict(
    model="resnet18", image_size=32, epochs=1, batch_size=16, workers=2, warmup_epochs=0, loader_workers=0
)
# Per size and benchmark: the options of its function, and under `training` the training settings it defaults to.
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "small": {
        "loader": dict(files=512),
        "staging": dict(files=500, classes=10),
        "scale": dict(sizes=[1_000, 10_000]),
        "flow": dict(training={**FLOW_TRAINING, "steps_per_epoch": 20}),
        "train": {},
        "parallel": {},
    },
    "tiny": {
        "loader": dict(files=64),
        "staging": dict(files=40, classes=4),
        "scale": dict(sizes=[300]),
        "flow": dict(training={**FLOW_TRAINING, "steps_per_epoch": 2}),
        "train": dict(training=dict(steps_per_epoch=3, batch_size=8, epochs=1)),
        "parallel": dict(training=dict(steps_per_epoch=2, epochs=1)),
    },
}
ORDER = ("loader", "staging", "train", "parallel", "flow", "images", "scale")


def bench_all(cfg: FlowConfig, json_out: Path | None, only: tuple[str, ...] = (), size: str = "small") -> Path:
    """Run the benchmarks `only` names (all by default) at `size`; write their JSON (by default
    WORKDIR/bench/all.json) and the report; its path."""
    check_choices(only, size)
    json_out = json_out or cfg.workdir / "bench" / "all.json"
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


def check_choices(only: tuple[str, ...], size: str) -> None:
    """Refuse a size that is not one of SIZES, or a benchmark that is not one of ORDER."""
    if size not in SIZES:
        raise ConfigError(f"--size {size} is not a size: pass {' or '.join(SIZES)}")
    if unknown := sorted(set(only) - set(ORDER)):
        raise ConfigError(f"--only {unknown[0]} is not a benchmark: pass one of {', '.join(ORDER)}")


def run_one(name: str, cfg: FlowConfig, size: dict) -> dict:
    """One benchmark at its size (its options, and its training settings under `training`); its figures."""
    options = {key: value for key, value in size.items() if key != "training"}
    return resolve_name(BENCHES[name])(with_training(cfg, size.get("training", {})), None, **options)
