"""`trainflow bench flow`: what a user waits for, `trainflow run`, against the same training under torchrun directly.

Both are whole commands timed from the outside: on trainflow's side its imports, Prefect's server, Azurite, the
staging checks, the pool and the report; on the other side the launcher's and the workers' start. Both get the
same resolved settings (written to one config file) and the same data. A first `trainflow run` stages the data
and is not measured; then REPEATS rounds of (torchrun, trainflow run), every figure the median with its min-max,
the overhead computed within each round. The fixed cost is also shown in parts, each timed alone in every round:
importing the flow, starting Prefect's server, starting Azurite.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from benchmarks import REPEATS
from benchmarks.common import bench_progress, shown, spread, time_call, write_json
from flows.config import FlowConfig
from flows.dataset import with_data
from infra.engines.contract import trainer_argv
from infra.engines.launchers import LaunchError, local_command
from infra.services.azurite import running_azurite
from infra.services.prefect_server import running_prefect_server

TRAINFLOW = str(Path(sys.executable).with_name("trainflow"))


def bench_flow(cfg: FlowConfig, json_out: Path | None, repeats: int = REPEATS) -> dict:
    """`repeats` rounds of the same training by torchrun and by `trainflow run`, after one unmeasured run, on the
    config's data (the digits set when it names none)."""
    cfg = with_data(cfg)
    root = cfg.workdir.resolve() / "bench" / "flow"
    shutil.rmtree(root, ignore_errors=True)
    config = root / "config.yaml"
    root.mkdir(parents=True)
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    flow = [TRAINFLOW, "run", "--config", str(config), "--workdir", str(root / "work")]
    direct = local_command(
        cfg.training.launcher, cfg.training.workers, trainer_argv(cfg.training, str(cfg.data), root / "direct")
    )
    rounds = []
    with bench_progress() as progress:
        bar = progress.add_task("trainflow run once, to stage the data (not measured)", total=1 + repeats * 3)
        timed_command(flow)
        progress.update(bar, advance=1, description=f"torchrun (1/{repeats})")
        for repeat in range(repeats):
            rounds.append(
                one_round(
                    flow,
                    direct,
                    root,
                    lambda what, repeat=repeat: progress.update(
                        bar, advance=1, description=f"{what} ({repeat + 1}/{repeats})"
                    ),
                )
            )
    result = summarise(rounds, cfg)
    print_flow_bench(result)
    write_json(result, json_out)
    return result


def one_round(flow: list[str], direct: list[str], root: Path, advance) -> dict:
    """Seconds of the direct run, of `trainflow run`, and of each part of the fixed cost."""
    shutil.rmtree(root / "direct", ignore_errors=True)
    seconds = {"torchrun": timed_command(direct)}
    advance("trainflow run")
    seconds["trainflow run"] = timed_command(flow)
    advance("the fixed cost's parts")
    seconds.update(fixed_parts(root))
    advance("torchrun")
    return seconds


def fixed_parts(root: Path) -> dict[str, float]:
    """Seconds to import the flow (a fresh Python), to start Prefect's server, and to start Azurite."""
    parts = {"import the flow": timed_command([sys.executable, "-c", "import cli, flows.train_flow"])}
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        parts["start Prefect's server"] = time_call(lambda: start_and_stop(running_prefect_server(Path(tmp) / "p")))
        parts["start Azurite"] = time_call(lambda: start_and_stop(running_azurite(Path(tmp) / "a")))
    return parts


def start_and_stop(service) -> None:
    """Enter a service's context (which returns once it answers) and leave it at once."""
    with service:
        pass


def timed_command(argv: list[str]) -> float:
    """Wall seconds of a whole command, which must succeed."""
    done: list[subprocess.CompletedProcess] = []
    seconds = time_call(lambda: done.append(subprocess.run(argv, capture_output=True, text=True)))
    if done[0].returncode != 0:
        raise LaunchError(
            f"{' '.join(argv[:3])} ... failed (exit {done[0].returncode}): "
            f"{(done[0].stderr or done[0].stdout).strip().splitlines()[-1:]}"
        )
    return seconds


def summarise(rounds: list[dict], cfg: FlowConfig) -> dict:
    """Every figure over the rounds; the overhead within each round."""
    return {
        "settings": {
            "model": cfg.training.model,
            "workers": cfg.training.workers,
            "epochs": cfg.training.epochs,
            "launcher": cfg.training.launcher,
            "data": str(cfg.data),
            "repeats": len(rounds),
        },
        "seconds": {what: spread([r[what] for r in rounds]) for what in rounds[0]},
        "overhead_seconds": spread([r["trainflow run"] - r["torchrun"] for r in rounds]),
        "overhead_fraction": spread([r["trainflow run"] / r["torchrun"] - 1 for r in rounds]),
    }


def print_flow_bench(result: dict) -> None:
    """The two commands and the fixed cost's parts as a table: medians, min-max in brackets."""
    s = result["settings"]
    table = Table(
        title=f"{s['model']}, {s['workers']} workers ({s['launcher']}), {s['epochs']} epochs: wall seconds, "
        f"median (min-max) of {s['repeats']} rounds"
    )
    table.add_column("what")
    table.add_column("seconds", justify="right")
    for what, figure in result["seconds"].items():
        table.add_row(
            what if what in ("torchrun", "trainflow run") else f"  part of the fixed cost: {what}", shown(figure, ".2f")
        )
    Console().print(table)
    Console().print(
        f"trainflow run's overhead: {shown(result['overhead_seconds'], '.1f')} s, "
        f"{shown(result['overhead_fraction'], '.1%')} of the direct run"
    )
