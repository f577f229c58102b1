"""`trainflow bench install`: how long installing takes, by the Makefile's own targets. Each round installs the
venv's base layer (all that `make demo` installs in Python: `make VENV=... INSTALLER=pip|uv .../.base`) from the lock
into a new venv, once with pip and once with uv, every cache empty. With --demo each round instead times `make demo`
in a fresh clone with an empty home (no pip, uv or npm cache, no Horovod wheel), then the same command again (the
second run a user makes). Who ran it (root or not) is part of the figures: the goal is a non-root user's.
"""

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.common import bench_progress, shown, spread, write_json
from flows.config import FlowConfig
from infra.core.errors import BadInput
from nodelib.cores import usable_cores

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("pip", "uv")  # pip: the baseline, what a user does without the Makefile's choice
# What this process's environment has that a user's shell would not: the checkout and venv it runs from, an outer make
NOT_A_USERS = {"PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}


def bench_install(
    cfg: FlowConfig, json_out: Path | None, repeats: int, demo: bool = False, user: str | None = None
) -> dict:
    """`repeats` rounds of the base layer by each tool, or with `demo` of `make demo`, run by `user` (root can
    time another user's install: the goal is a non-root user's); print and return."""
    root = cfg.workdir.resolve() / "bench" / "install"
    who = User(user)
    rounds = []
    with bench_progress() as progress:
        bar = progress.add_task("install benchmark", total=repeats)
        for _ in range(repeats):
            if demo:
                rounds.append(dict(zip(("demo", "demo_again"), demo_seconds(root / "demo", who))))
            else:
                rounds.append({tool: base_layer_seconds(tool, root / tool, who) for tool in TOOLS})
            progress.advance(bar)
    shutil.rmtree(root, ignore_errors=True)
    result = summarise(rounds, who.name)
    print("\n".join(lines(result)))
    write_json(result, json_out)
    return result


class User:
    """Who runs the timed commands: this process's user, or (run by root) the user named."""

    def __init__(self, name: str | None):
        if name is not None and os.getuid() != 0:
            raise BadInput(f"--user {name} needs root (only root starts commands as another user); leave it out")
        try:
            self.entry = pwd.getpwnam(name) if name else pwd.getpwuid(os.getuid())
        except KeyError:
            raise BadInput(f"--user {name}: no such user on this machine; create it (useradd -m {name})") from None
        self.name, self.switch = self.entry.pw_name, name is not None

    def folder(self, path: Path) -> Path:
        """`path`, made empty and theirs."""
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        os.chown(path, self.entry.pw_uid, self.entry.pw_gid)
        return path

    def own(self, path: Path) -> None:
        """Make everything under `path` theirs (a clone that this process made)."""
        if self.switch:
            subprocess.run(["chown", "-R", f"{self.entry.pw_uid}:{self.entry.pw_gid}", str(path)], check=True)

    def run(self, command: list[str], cwd: Path, env: dict[str, str], out: Any = None) -> int:
        """`command`'s exit status, run as this user."""
        as_them: dict[str, Any] = {"user": self.entry.pw_uid, "group": self.entry.pw_gid, "extra_groups": []}
        done = subprocess.run(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, **(as_them if self.switch else {})
        )
        return done.returncode


def base_layer_seconds(tool: str, where: Path, who: User) -> float:
    """Seconds of `make <where>/venv/.base INSTALLER=<tool>` with every cache under `where`, made empty first."""
    venv = who.folder(where) / "venv"
    return timed(
        ["make", "-s", f"VENV={venv}", f"INSTALLER={tool}", f"{venv}/.base"], REPO, empty_home(where, who), who
    )


def demo_seconds(where: Path, who: User) -> tuple[float, float]:
    """Seconds of `make demo` in a fresh clone with an empty home, then of the same command again."""
    clone = who.folder(where) / "clone"
    env = empty_home(where, who)
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    who.own(clone)
    return timed(["make", "demo"], clone, env, who), timed(["make", "demo"], clone, env, who)


def empty_home(where: Path, who: User) -> dict[str, str]:
    """The environment of a user whose home (and so every cache: pip's, uv's, npm's, the Horovod wheel's) is an
    empty folder under `where`."""
    home = who.folder(where / "home")
    caches = {"PIP_CACHE_DIR": "pip", "UV_CACHE_DIR": "uv", "npm_config_cache": "npm", "XDG_CACHE_HOME": ""}
    env = {k: v for k, v in os.environ.items() if k not in NOT_A_USERS}
    env |= {"HOME": str(home), "USER": who.name, "LOGNAME": who.name}
    return env | {k: str(home / ".cache" / v) for k, v in caches.items()}


def timed(command: list[str], cwd: Path, env: dict[str, str], who: User) -> float:
    """Wall seconds of `command`; its output goes to a log beside the home, and a failure is one line that names it."""
    log = Path(env["HOME"]).parent / "log.txt"
    started = time.perf_counter()
    with open(log, "a") as out:
        status = who.run(command, cwd, env, out)
    if status:
        raise BadInput(f"`{' '.join(command)}` failed (exit {status}) in {cwd}; its output: {log}")
    return time.perf_counter() - started


def summarise(rounds: list[dict], user: str) -> dict:
    """Every figure over the rounds, pip's time over uv's within each round, and who ran them."""
    ratio = {"pip_over_uv": spread([r["pip"] / r["uv"] for r in rounds])} if "pip" in rounds[0] else {}
    seconds = {name: spread([r[name] for r in rounds]) for name in rounds[0]}
    root = pwd.getpwnam(user).pw_uid == 0
    return {"seconds": seconds, **ratio, "user": user, "as_root": root, "cores": usable_cores()}


NAMES = {
    "pip": "base layer by pip",
    "uv": "base layer by uv",
    "demo": "make demo, fresh clone",
    "demo_again": "make demo, again",
}


def lines(result: dict) -> list[str]:
    """The figures as a person reads them."""
    user = result.get("user", "root" if result["as_root"] else "a non-root user")
    who = f"run as {user}" + ("" if user == "root" else " (root)" if result["as_root"] else " (not root)")
    ratio = result.get("pip_over_uv")
    return [
        *(f"{NAMES[name]}: {shown(figure, '.0f')} s" for name, figure in result["seconds"].items()),
        f"pip against uv, within each round: {shown(ratio, '.2f')}x the time; {who}" if ratio else who,
    ]
