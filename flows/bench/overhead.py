"""`trainflow bench flow`: the same training job directly and through the whole flow, every earlier step cached."""

import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from flows.bench.common import time_call, write_json
from flows.config import FlowConfig
from flows.train_flow import train_flow
from infra.backends.process import train_here


def bench_flow(cfg: FlowConfig, json_out: Path | None) -> dict:
    """The same training job run directly (torchrun on the staged data) and through the whole flow with
    every earlier step cached; prints the flow's overhead as a fraction of the direct run, and each step's time.

    A first flow run stages the data and is not measured."""
    root = cfg.workdir.resolve() / "bench" / "flow"
    shutil.rmtree(root, ignore_errors=True)
    cfg = cfg.model_copy(update={"workdir": root})
    console = Console()
    console.print("warm-up: the flow once, to stage the data (not measured)")
    staged = train_flow(cfg)["steps"][2]["path"]
    console.print("direct: torchrun on the staged data")
    direct = time_call(lambda: train_here(cfg.training, str(Path(staged).resolve()), root / "direct", root / "pools",
                                          lambda _: None))
    console.print("the whole flow, everything before training cached")
    started = time.perf_counter()
    flow = train_flow(cfg)
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
    write_json(result, json_out)
    return result
