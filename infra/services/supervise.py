"""Local services that trainflow starts itself (Azurite, dockerd, a registry, Prefect's server): ports, start-up, stop.

Each runs on a leash (infra/services/leash.py) in its own session: the terminal's Ctrl-C reaches trainflow alone,
which then stops the services in order, and a trainflow killed outright takes them with it.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.core.errors import TrainflowError

LEASH = Path(__file__).with_name("leash.py")


class ServiceError(TrainflowError):
    """A local service is missing or did not start."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on host:port."""
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def wait_until(ready, proc: subprocess.Popen, seconds: float, name: str, log: Path, error=ServiceError) -> None:
    """Return once `ready()` holds; raise `error` if the process exits first or time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise error(f"{name} exited with status {proc.returncode} at start-up; see {log}")
        if ready():
            return
        time.sleep(0.1)
    raise error(f"{name} did not start within {seconds:.0f} s; see {log}")


def spawn(cmd: list[str], **popen) -> subprocess.Popen:
    """Start `cmd` on a leash in a session of its own: stopped with its group by `stop`, or by the leash when this
    process ends without stopping it. `popen` are Popen's arguments for its output."""
    return subprocess.Popen([sys.executable, str(LEASH), *cmd], stdin=subprocess.PIPE, start_new_session=True, **popen)


@contextmanager
def running_service(
    cmd: list[str],
    log: Path,
    ready: Callable[[], bool],
    name: str,
    seconds: float,
    error=ServiceError,
    env: dict | None = None,
) -> Iterator[subprocess.Popen]:
    """`cmd` as a service for the block, its output appended to `log`: yields once `ready()` holds, stops it after."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = spawn(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until(ready, proc, seconds, name, log, error)
            yield proc
        finally:
            stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """Stop a service started in its own session, and its children: politely, then for sure."""
    for sig, wait in ((signal.SIGINT, 5), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
