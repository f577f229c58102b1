"""One rank of a user's own training script: what torchrun or horovodrun starts on every node in its place.

    torchrun --nproc_per_node 2 scriptrun/rank.py train.py --epochs 3
    horovodrun -np 2 python scriptrun/rank.py -m mypackage.train --epochs 3

It starts the script (`ENTRY [ARG...]`, or `-m MODULE [ARG...]`) with this interpreter in the working folder that
TRAINFLOW_WORK_DIR names, and prints each of its lines, stdout and stderr alike, as `[rank N] line`: the rank from
the launcher's variables (RANK, HOROVOD_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK). A carriage return ends a line too, so a
progress bar becomes lines. SIGTERM, SIGINT and SIGHUP go on to the script, which may save before it exits.

When the script fails, one event line (nodelib/records.py's Failure) says how, for the orchestrator: an argparse usage
error or a SyntaxError (exit status 2) is the script's input ("usage": never retried); any other failure is the
script's own ("script": not retried) unless its exit status is one that TRAINFLOW_RETRY_EXIT_CODES lists ("fault":
retried). A script killed by a signal dies here by the same signal, so the launcher reports it as such.

Where TRAINFLOW_PREPARE_FROM names the scripts version (Azure ML, whose results folder exists only on the nodes), the
run's folders are made first, once per node (scriptrun/prepare.py); a version that is not the one it is named after
is the run's input ("usage"), said in one line.

The standard library only, with the trainer's records beside it: it runs on the nodes.
"""

import os
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # nodelib/ and scriptrun/ (this package's parent)
from nodelib.records import Failure, event_line, rank_prefix
from scriptrun.prepare import prepare_once

RANK_VARIABLES = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
TAIL = 20  # the script's last lines kept, to say why it failed
# A PyTorch script runs with TensorFlow hidden where both are installed (pytorch_site/sitecustomize.py says why).
PYTORCH_SITE = Path(__file__).resolve().parent / "pytorch_site"


def rank_of(env: dict[str, str] | os._Environ) -> int:
    """This process's global rank, as the launcher that started it says (0 alone)."""
    for name in RANK_VARIABLES:
        if env.get(name, "").isdigit():
            return int(env[name])
    return 0


def split_lines(pending: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    """The whole lines of `pending + chunk` (ended by \\n, \\r or \\r\\n; empty ones dropped) and what is left over."""
    data = (pending + chunk).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    *lines, rest = data.split(b"\n")
    return [line for line in lines if line.strip()], rest


def failure(code: int, tail: list[str], retried: set[int]) -> Failure:
    """How a script that exited with `code` failed, from its last lines."""
    said = [line for line in tail if line.strip()]
    usage = code == 2 and any(line.startswith("usage:") for line in said)
    syntax = any(line.startswith(("SyntaxError:", "IndentationError:")) for line in said[-1:])
    last = said[-1] if said else f"it exited with status {code} and printed nothing"
    if usage or syntax:
        return Failure(last, "usage")
    return Failure(last, "fault" if code in retried else "script")


def retried_codes(env: dict[str, str] | os._Environ) -> set[int]:
    """The exit statuses TRAINFLOW_RETRY_EXIT_CODES lists (comma-separated)."""
    return {int(code) for code in env.get("TRAINFLOW_RETRY_EXIT_CODES", "").split(",") if code.strip().isdigit()}


def child_env(env: dict[str, str] | os._Environ) -> dict[str, str]:
    """The script's environment: this one, with TensorFlow hidden from a PyTorch script."""
    child = dict(env)
    if env.get("TRAINFLOW_FRAMEWORK") == "pytorch":
        child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTORCH_SITE), env.get("PYTHONPATH", "")]))
    return child


def relay(child: subprocess.Popen, prefix: str) -> list[str]:
    """Print the child's lines with `prefix` as they come; its last lines."""
    tail: deque[str] = deque(maxlen=TAIL)
    pending, out = b"", sys.stdout
    assert child.stdout is not None
    while chunk := os.read(child.stdout.fileno(), 65536):
        lines, pending = split_lines(pending, chunk)
        for line in lines:
            text = line.decode("utf-8", "replace")
            tail.append(text)
            out.write(f"{prefix}{text}\n")
        out.flush()
    if pending.strip():
        tail.append(pending.decode("utf-8", "replace"))
        out.write(f"{prefix}{tail[-1]}\n")
        out.flush()
    return list(tail)


def main(argv: list[str]) -> int:
    """Run the script as this rank; its exit status."""
    if not argv:
        print("usage: rank.py ENTRY [ARG...] | rank.py -m MODULE [ARG...]", file=sys.stderr)
        return 2
    prefix = rank_prefix(rank_of(os.environ))
    cwd = os.environ.get("TRAINFLOW_WORK_DIR") or None
    if (version := os.environ.get("TRAINFLOW_PREPARE_FROM")) and cwd:
        key = f"{os.environ.get('TRAINFLOW_RUN_ID', '')}-{os.environ.get('TRAINFLOW_ATTEMPT', '')}"
        if problem := prepare_once(Path(version), Path(cwd).parent, key):
            said = f"scripts version {version} cannot be run: {problem}; delete the file share's scripts/ folder (the "
            print(prefix + event_line(Failure(said + "next run uploads the scripts afresh)", "usage")), flush=True)
            return 2
    child = subprocess.Popen(
        [sys.executable, *argv], cwd=cwd, env=child_env(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    for sig in FORWARDED:
        signal.signal(sig, lambda number, frame: child.send_signal(number))
    tail = relay(child, prefix)
    code = child.wait()
    if code < 0:  # killed by a signal: die by it too, so the launcher says so
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    if code > 0:
        print(prefix + event_line(failure(code, tail, retried_codes(os.environ))), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
