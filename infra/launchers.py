"""The launchers, torchrun and horovodrun: their command lines, and how their output is read.

A launcher's output is sorted by the rank that printed it into rank<N>.log (every trainer line starts
with `[rank N]`); when the run fails, one message names the rank that died first and why.
"""

import re
import sys
from pathlib import Path
from typing import Callable, Iterable

from infra.errors import TrainflowError
from infra.trainer import ERROR_LINE, RANK_LINE

# How the launchers report a worker that died without a word: torchrun's failure summary, horovodrun's line.
DIED_LINE = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank|Process (\d+) exit with status code (\d+)")


class LaunchError(TrainflowError):
    """Training did not finish; the message says which rank and why."""


def horovodrun_options(workers: int, hosts: str, nic: str) -> list[str]:
    """horovodrun's options: `workers` processes on `hosts` (host:slots,...), Gloo over interface `nic`."""
    return ["-np", str(workers), "-H", hosts, "--gloo", "--network-interfaces", nic]


def torchrun_options(nodes: int | str, per_node: int, node_rank: int | str, master_addr: str,
                     master_port: int | str) -> list[str]:
    """torchrun's options for one node of a multi-node world (static rendezvous at master_addr:master_port)."""
    return ["--nnodes", str(nodes), "--nproc_per_node", str(per_node), "--node_rank", str(node_rank),
            "--master_addr", master_addr, "--master_port", str(master_port)]


def local_command(launcher: str, workers: int, trainer: list[str], python: str = sys.executable) -> list[str]:
    """The torchrun or horovodrun command line that starts `workers` local processes of `trainer` (its argv)."""
    if launcher == "torchrun":
        return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(workers), *trainer]
    horovodrun = str(Path(python).parent / "horovodrun")
    return [horovodrun, *horovodrun_options(workers, f"localhost:{workers}", "lo"), python, *trainer]


def route_output(lines: Iterable[str], wait: Callable[[], int], log_dir: Path, echo: Callable[[str], None]) -> int:
    """Write each rank's lines to log_dir/rank<N>.log and all lines to launcher.log, pass the ranks' lines to
    `echo`, then wait for the exit status; raise LaunchError naming the failing rank, with its error or last lines."""
    log_dir.mkdir(parents=True, exist_ok=True)
    logs: dict[int, list[str]] = {}
    died: list[int] = []  # ranks the launcher reported dead, in order
    roots: list[int] = []  # torchrun's "Root Cause" ranks; with one torchrun per node, the first node's comes first
    root_next = False
    with open(log_dir / "launcher.log", "w") as all_lines:
        for line in lines:
            all_lines.write(line)
            match = RANK_LINE.search(line)
            if match:
                logs.setdefault(int(match.group(1)), []).append(line[match.start():])
                echo(line[match.start():].rstrip("\n"))
            elif "Root Cause" in line:  # torchrun lists the first rank to fail last, after the others
                root_next = True
            elif dead := DIED_LINE.search(line):
                (roots if root_next else died).append(int(dead.group(1) or dead.group(2)))
                root_next = False
        code = wait()
    for rank, lines in logs.items():
        (log_dir / f"rank{rank}.log").write_text("".join(lines))
    if code != 0:
        raise LaunchError(describe_failure(code, logs, log_dir, roots + died))
    return code


def describe_failure(code: int, logs: dict[int, list[str]], log_dir: Path, died: list[int] | None = None) -> str:
    """One message for a failed run: an input error (it set off the rest), else the rank the launcher saw die
    first (not a peer that then lost its connection to it) with its error or last lines, else any rank's
    error, else every rank's last lines."""
    errors = [(rank, m.group(2)) for rank, lines in logs.items() for m in map(ERROR_LINE.search, lines) if m]
    inputs = [e for e in errors if not e[1].startswith("unexpected ")]
    if not inputs and died:
        own = [message for rank, message in errors if rank == died[0]]
        if own:
            return f"rank {died[0]} failed: {own[0]}"
        tail = "".join(logs.get(died[0], [])[-5:]) or "(no output)\n"
        return f"rank {died[0]} failed: it died without an error (exit status {code}); its last lines:\n{tail}"
    if inputs or errors:
        rank, message = (inputs or errors)[0]
        return f"rank {rank} failed: {message}"
    tail = "".join(line for lines in logs.values() for line in lines[-5:])
    return f"training exited with status {code}; see {log_dir}/launcher.log. Last lines:\n{tail}"
