"""`trainflow bench install`: how long installing takes, by the Makefile's own targets. Each round installs the
venv's base layer (all that `make demo` installs in Python: `make VENV=... INSTALLER=pip|uv .../.base`) from the lock
into a new venv, once with pip and once with uv, every cache empty. With --demo each round instead times `make demo`
in a fresh clone with an empty home (no pip, uv or npm cache, no Horovod wheel), then the same command again (the
second run a user makes). Who ran it (root or not) is part of the figures: the goal is a non-root user's.
"""

import os
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks.common import bench_progress, shown, spread, write_json
from flows.config import FlowConfig
from infra.core.errors import BadInput

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("pip", "uv")  # pip: the baseline, what a user does without the Makefile's choice


def bench_install(cfg: FlowConfig, json_out: Path | None, repeats: int, demo: bool = False) -> dict:
    """`repeats` rounds of the base layer by each tool, or with `demo` of `make demo`; print and return."""
    root = cfg.workdir.resolve() / "bench" / "install"
    rounds = []
    with bench_progress() as progress:
        bar = progress.add_task("install benchmark", total=repeats)
        for _ in range(repeats):
            if demo:
                rounds.append(dict(zip(("demo", "demo_again"), demo_seconds(root / "demo"))))
            else:
                rounds.append({tool: base_layer_seconds(tool, root / tool) for tool in TOOLS})
            progress.advance(bar)
    shutil.rmtree(root, ignore_errors=True)
    result = summarise(rounds)
    print("\n".join(lines(result)))
    write_json(result, json_out)
    return result


def base_layer_seconds(tool: str, where: Path) -> float:
    """Seconds of `make <where>/venv/.base INSTALLER=<tool>` with every cache under `where`, made empty first."""
    shutil.rmtree(where, ignore_errors=True)
    venv = where / "venv"
    return timed(["make", "-s", f"VENV={venv}", f"INSTALLER={tool}", f"{venv}/.base"], REPO, empty_home(where))


def demo_seconds(where: Path) -> tuple[float, float]:
    """Seconds of `make demo` in a fresh clone with an empty home, then of the same command again."""
    shutil.rmtree(where, ignore_errors=True)
    clone = where / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    env = empty_home(where)
    return timed(["make", "demo"], clone, env), timed(["make", "demo"], clone, env)


def empty_home(where: Path) -> dict[str, str]:
    """The environment of a user whose home (and so every cache: pip's, uv's, npm's, the Horovod wheel's) is an
    empty folder under `where`."""
    home = where / "home"
    home.mkdir(parents=True, exist_ok=True)
    caches = {"PIP_CACHE_DIR": "pip", "UV_CACHE_DIR": "uv", "npm_config_cache": "npm", "XDG_CACHE_HOME": ""}
    return {**os.environ, "HOME": str(home), **{k: str(home / ".cache" / v) for k, v in caches.items()}}


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Wall seconds of `command`; its output goes to a log beside the home, and a failure is one line that names it."""
    log = Path(env["HOME"]).parent / "log.txt"
    started = time.perf_counter()
    with open(log, "a") as out:
        done = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise BadInput(f"`{' '.join(command)}` failed (exit {done.returncode}) in {cwd}; its output: {log}")
    return time.perf_counter() - started


def summarise(rounds: list[dict]) -> dict:
    """Every figure over the rounds, pip's time over uv's within each round, and who ran it."""
    ratio = {"pip_over_uv": spread([r["pip"] / r["uv"] for r in rounds])} if "pip" in rounds[0] else {}
    seconds = {name: spread([r[name] for r in rounds]) for name in rounds[0]}
    return {"seconds": seconds, **ratio, "as_root": os.getuid() == 0, "cores": len(os.sched_getaffinity(0))}


NAMES = {
    "pip": "base layer by pip",
    "uv": "base layer by uv",
    "demo": "make demo, fresh clone",
    "demo_again": "make demo, again",
}


def lines(result: dict) -> list[str]:
    """The figures as a person reads them."""
    who = "run as " + ("root" if result["as_root"] else "a non-root user")
    ratio = result.get("pip_over_uv")
    return [
        *(f"{NAMES[name]}: {shown(figure, '.0f')} s" for name, figure in result["seconds"].items()),
        f"pip against uv, within each round: {shown(ratio, '.2f')}x the time; {who}" if ratio else who,
    ]
