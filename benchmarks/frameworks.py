"""`trainflow bench frameworks`: synthetic ResNet-50 images/s of each framework's trainer on this machine, side by
side, as ratios to PyTorch's measured in the same round.

Each framework trains one process (all of its cores: training.threads 0) on the same synthetic batches, the same
model (ResNet-50: the same architecture in every framework) and the same settings; the figure is the last epoch's
steady rate (after its first step, which also builds the graph or infers shapes), the rule of every bench. Each
round runs every framework once, in turn; REPEATS rounds; every figure the median with its min-max, the ratios
computed within a round.
"""

from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import REPEATS
from benchmarks.common import as_framework, bench_progress, clear_checkpoints, shown, spread, steady_rate, write_json
from flows.config import FlowConfig
from infra.compute.process import train_here
from infra.engines import ENGINES

# The reference model at the reference size, small batches and few steps: minutes on 2 CPU cores. Any of these can
# be set in the config file's training section.
FRAMEWORK_BENCH_DEFAULTS = dict(
    model="resnet50",
    image_size=224,
    batch_size=8,
    epochs=2,
    steps_per_epoch=4,
    warmup_epochs=0,
    checkpoint_every=0,
    log_every=2,
    loader_workers=0,
    workers=1,
)


def bench_frameworks(
    cfg: FlowConfig, json_out: Path | None, frameworks: tuple[str, ...] = (), repeats: int = REPEATS
) -> dict:
    """Train each framework (default: every one) on synthetic data, `repeats` rounds; print and return."""
    runs = {f: as_framework(FRAMEWORK_BENCH_DEFAULTS, cfg.training, f) for f in dict.fromkeys(frameworks or ENGINES)}
    root = cfg.workdir.resolve() / "bench" / "frameworks"
    rounds: list[dict[str, float]] = []
    with bench_progress() as progress:
        bar = progress.add_task("frameworks benchmark", total=repeats * len(runs))
        for repeat in range(repeats):  # interleaved: a slow spell of the machine touches every framework
            rates = {}
            for framework, training in runs.items():
                progress.update(bar, description=f"{framework} ({repeat + 1}/{repeats})")
                out = root / framework
                clear_checkpoints(out)
                rates[framework] = steady_rate(train_here(training, "synthetic", out, root / "pools", lambda _: None))
                progress.advance(bar)
            rounds.append(rates)
    result = summarise_frameworks(rounds, next(iter(runs.values())).model_dump(exclude={"framework", "launcher"}))
    print_frameworks_bench(result)
    write_json(result, json_out)
    return result


def summarise_frameworks(rounds: list[dict[str, float]], settings: dict) -> dict:
    """Each framework's images/s over the rounds and, where PyTorch ran, its ratio to PyTorch's within each round."""
    return {
        "settings": settings | {"data": "synthetic", "repeats": len(rounds)},
        "runs": [
            {
                "framework": framework,
                "images_per_sec": spread([r[framework] for r in rounds]),
                "vs_pytorch": spread([r[framework] / r["pytorch"] for r in rounds]) if "pytorch" in rounds[0] else None,
            }
            for framework in rounds[0]
        ],
    }


def print_frameworks_bench(result: dict) -> None:
    """A table of the frameworks: images/s and the ratio to PyTorch, medians, min-max in brackets."""
    s = result["settings"]
    table = Table(
        title=f"synthetic training, one process per framework: {s['model']}, {s['image_size']} px, batch "
        f"{s['batch_size']}, steady images/s, median (min-max) of {s['repeats']} rounds"
    )
    for column in ("framework", "images/s", "vs PyTorch"):
        table.add_column(column, justify="right")
    for r in result["runs"]:
        ratio = r["vs_pytorch"]
        table.add_row(r["framework"], shown(r["images_per_sec"], ".2f"), "" if ratio is None else shown(ratio, ".2f"))
    Console().print(table)
