"""Local services that trainflow starts itself (Azurite, dockerd, a registry): ports, start-up, stop."""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from infra.errors import TrainflowError


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
