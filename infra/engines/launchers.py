"""The launchers, torchrun and horovodrun: their command lines, and how their output is read.

A launcher's output is sorted by the rank that printed it into rank<N>.log (every trainer line starts
with `[rank N]`); when the run fails, one message names the rank that died first and why.
"""

import re
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from infra.core.errors import TrainflowError
from infra.services.supervise import ended as how_it_ended
from nodelib.records import Event, Failure, line_rank, read_event

# How the launchers report a worker that ended. torchrun's failure summary: a "rank : N (local_rank: M)" line, then
# "exitcode : -9 (pid: P)" (negative: the signal that killed it), the first to fail after "Root Cause". horovodrun:
# "Process N exit with status code 137", a shell's status (128 + the signal that killed it).
TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank")
TORCHRUN_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
HOROVOD_EXIT = re.compile(r"Process (\d+) exit with status code (\d+)")
OOM_HINT = ", as the kernel does when memory runs out (lower training.batch_size or training.loader_workers)"


class LaunchError(TrainflowError):
    """Training did not finish; the message says which rank and why."""


class RankRefused(LaunchError):
    """A rank stopped on its input (a trainer's bad data, a script's usage error): another attempt would too."""

    permanent = True
    exit_code = 2


# The causes of a user's script's Failure (nodelib/records.py, said by scriptrun/rank.py) that another attempt would
# meet again: its usage error is the run's input (exit 2), an exception its own (exit 1); neither is retried
# (rank.py says "fault" for an exit status the user listed as worth a retry). The trainer's own causes keep their
# rule: retried once (its preflight refuses bad input before any worker).
REFUSED, NOT_RETRIED = "usage", "script"


# Horovod's background thread wakes every cycle to negotiate which gradients are ready, even when none is: at its 1 ms
# default it burns 0.07 CPU s per s per idle rank here, 0.03 at 5 ms (README "Scaling"); 5 ms is a small delay
# next to a step of hundreds of ms, and the CPU goes to the training threads on machines with few cores.
HOROVOD_CYCLE_TIME_MS = 5


def horovodrun_options(workers: int, hosts: str, nic: str) -> list[str]:
    """horovodrun's options: `workers` processes on `hosts` (host:slots,...), Gloo over interface `nic`, and the
    background thread's cycle time."""
    return [
        "-np",
        str(workers),
        "-H",
        hosts,
        "--gloo",
        "--network-interfaces",
        nic,
        "--cycle-time-ms",
        str(HOROVOD_CYCLE_TIME_MS),
    ]


# torchrun makes a log folder per launch, /tmp/torchelastic_*/ unless --log-dir names one, and leaves it behind (empty:
# its per-rank files exist only when asked to redirect or tee, and trainflow reads its output instead). /dev/null makes
# none, and no error files either: the trainer does not write them (torch/distributed/elastic/multiprocessing/api.py,
# DefaultLogsSpecs; torchrun's failure summary then says "error_file: <N/A>", which route_output does not read).
TORCHRUN_NO_LOG_DIR = ["--log-dir", "/dev/null"]


def torchrun_options(
    nodes: int | str, per_node: int, node_rank: int | str, master_addr: str, master_port: int | str
) -> list[str]:
    """torchrun's options for one node of a multi-node world (static rendezvous at master_addr:master_port)."""
    return [
        "--nnodes",
        str(nodes),
        "--nproc_per_node",
        str(per_node),
        "--node_rank",
        str(node_rank),
        "--master_addr",
        master_addr,
        "--master_port",
        str(master_port),
        *TORCHRUN_NO_LOG_DIR,
    ]


def local_command(launcher: str, workers: int, trainer: list[str], python: str = sys.executable) -> list[str]:
    """The torchrun or horovodrun command line that starts `workers` local processes of `trainer` (its argv)."""
    if launcher == "torchrun":
        options = ["--standalone", "--nproc_per_node", str(workers), *TORCHRUN_NO_LOG_DIR]
        return [python, "-m", "torch.distributed.run", *options, *trainer]
    horovodrun = str(Path(python).parent / "horovodrun")
    return [horovodrun, *horovodrun_options(workers, f"localhost:{workers}", "lo"), python, *trainer]


def route_output(
    lines: Iterable[str],
    wait: Callable[[], int],
    log_dir: Path,
    echo: Callable[[str], None],
    on_event: Callable[[Event], None] = lambda event: None,
) -> int:
    """Write each rank's lines to log_dir/rank<N>.log and all lines to launcher.log, pass the ranks' log lines for
    people to `echo` and their events (nodelib/records.py) to `on_event`, then wait for the exit status; raise
    LaunchError naming the failing rank, with its error or last lines."""
    log_dir.mkdir(parents=True, exist_ok=True)
    logs: dict[int, list[str]] = {}
    ended = Casualties()
    with open(log_dir / "launcher.log", "w") as all_lines:
        for line in lines:
            all_lines.write(line)
            if ranked := line_rank(line):
                logs.setdefault(ranked[0], []).append(ranked[1])
                event = read_event(ranked[1])
                on_event(event) if event else echo(ranked[1].rstrip("\n"))
            else:
                ended.read(line)
        code = wait()
    for rank, lines in logs.items():
        (log_dir / f"rank{rank}.log").write_text("".join(lines))
    if code != 0:
        raise launch_error(describe_failure(code, logs, log_dir, ended.first(), ended.status), logs)
    return code


def launch_error(message: str, logs: dict[int, list[str]]) -> LaunchError:
    """The error of a failed run: refused (exit 2, never retried) when a rank stopped on its input, not retried when
    a script failed on its own, else worth another attempt."""
    causes = {event.cause for lines in logs.values() for event in map(read_event, lines) if isinstance(event, Failure)}
    if REFUSED in causes:
        return RankRefused(message)
    return LaunchError(message, permanent=NOT_RETRIED in causes or None)


@dataclass
class Casualties:
    """The ranks a launcher reported ended, and how: read from its lines as they come."""

    died: list[int] = field(default_factory=list)  # in the order reported
    roots: list[int] = field(default_factory=list)  # torchrun's "Root Cause" ranks; one torchrun per node, in order
    status: dict[int, int] = field(default_factory=dict)  # rank -> exit status (negative: the signal that killed it)
    root_next: bool = False
    rank: int | None = None  # the rank whose torchrun summary is being read

    def read(self, line: str) -> None:
        """Take note of one launcher line (torchrun lists the first rank to fail last, after "Root Cause")."""
        if "Root Cause" in line:
            self.root_next = True
        elif found := TORCHRUN_RANK.search(line):
            self.rank = int(found.group(1))
            (self.roots if self.root_next else self.died).append(self.rank)
            self.root_next = False
        elif (found := TORCHRUN_EXIT.search(line)) and self.rank is not None:
            self.status[self.rank] = int(found.group(1))
        elif found := HOROVOD_EXIT.search(line):
            rank, code = int(found.group(1)), int(found.group(2))
            self.died.append(rank)
            self.status[rank] = 128 - code if 128 < code < 128 + signal.NSIG else code

    def first(self) -> list[int]:
        """The ranks that died, the first to fail first."""
        return self.roots + self.died


def script_tail(lines: list[str], count: int = 8) -> str:
    """A script's last lines before it failed (its traceback's end), for the one message of its failure."""
    said = [line for line in lines if not read_event(line)]
    return "; its last lines:\n" + "".join(said[-count:])


def describe_failure(
    code: int,
    logs: dict[int, list[str]],
    log_dir: Path,
    died: list[int] | None = None,
    status: dict[int, int] | None = None,
) -> str:
    """One message for a failed run: an input error (it set off the rest), else the rank the launcher saw die
    first (not a peer that then lost its connection to it) with its error, the signal that killed it or its exit
    status, and its last lines, else any rank's error, else every rank's last lines."""
    failures = [(rank, e) for rank, lines in logs.items() for e in map(read_event, lines) if isinstance(e, Failure)]
    errors = [(rank, failure.message) for rank, failure in failures]
    inputs = [(rank, failure.message) for rank, failure in failures if failure.cause not in ("unexpected", NOT_RETRIED)]
    if not inputs and died:
        rank = died[0]
        own = [message for r, message in errors if r == rank]
        tail = "".join(logs.get(rank, [])[-5:]) or "(no output)\n"
        if own:
            scripted = any(r == rank and f.cause == NOT_RETRIED for r, f in failures)
            return f"rank {rank} failed: {own[0]}" + (script_tail(logs[rank]) if scripted else "")
        rank_status = (status or {}).get(rank, code)
        if rank_status >= 0:
            return f"rank {rank} failed: it died without an error (exit status {rank_status}); its last lines:\n{tail}"
        hint = OOM_HINT if rank_status == -signal.SIGKILL else ""
        return f"rank {rank} {how_it_ended(rank_status)}{hint}; its last lines:\n{tail}"
    if inputs or errors:
        rank, message = (inputs or errors)[0]
        scripted = not inputs and any(r == rank and f.cause == NOT_RETRIED for r, f in failures)
        return f"rank {rank} failed: {message}" + (script_tail(logs[rank]) if scripted else "")
    tail = "".join(line for lines in logs.values() for line in lines[-5:])
    return f"training {how_it_ended(code)}; see {log_dir}/launcher.log. Last lines:\n{tail}"
