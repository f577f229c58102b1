"""Local services that trainflow starts itself (Azurite, dockerd, a registry, Prefect's server): ports, start-up, a
watch on each while it runs, stop.

Each runs on a leash (infra/services/leash.py) in its own session: the terminal's Ctrl-C reaches trainflow alone,
which then stops the services in order, and a trainflow killed outright takes them with it. While one runs, a thread
waits on it: if it exits before trainflow stops it, a line on stderr says at once which one, how it ended and the last
lines of its log; calls to its endpoint then fail with that fault (`death_at`) instead of waiting on a dead address,
or, for a service that may be restarted (Prefect's server), it is started again with the same command. Once the
command is stopping (infra/core/stopping.py), a service that ends is neither restarted nor reported: systemd and
Kubernetes stop a command by sending SIGTERM to every one of its processes at once.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from infra.core.errors import TrainflowError
from infra.core.redact import redact
from infra.core.stopping import stopping

LEASH = Path(__file__).with_name("leash.py")
TAIL_LINES = 5
# How long a watcher waits, when its service ends, for the command's own interrupt: a SIGTERM sent to every process
# reaches both at once, and the service may be seen to end first.
STOPPING_GRACE = 1.0
# The CPU priority, below trainflow's own, of the services that only keep the books while a training runs on this
# machine (Prefect's server, Azurite). Their wake-ups, about 200 a second for Prefect's server while idle, each delay
# a rank that a collective then waits on: on 2 cores a Horovod script ran at 0.75 of its by-hand speed beside them,
# 0.963 with them at nice 10 (docs/benchmarks/script-2026-12-07-priority.md). They still get the CPU whenever the
# ranks wait. Lowered once ready: a start-up at full priority keeps within its time limit on a busy machine.
BOOKKEEPING_NICE = 10


class ServiceError(TrainflowError):
    """A local service is missing or did not start."""


class ServiceDied(ServiceError):
    """A service trainflow started exited while a step needed it. A fault (exit 1), not bad input; retrying the step
    in this command would meet the same dead service, so it ends the command, and a re-run starts the service again."""

    permanent = True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on host:port."""
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def spawn(cmd: list[str], **popen) -> subprocess.Popen:
    """Start `cmd` on a leash in a session of its own: stopped with its group by `stop`, or by the leash when this
    process ends without stopping it. `popen` are Popen's arguments for its output."""
    return subprocess.Popen([sys.executable, str(LEASH), *cmd], stdin=subprocess.PIPE, start_new_session=True, **popen)


def ended(status: int) -> str:
    """A process's end from its exit status: "was killed by signal 9 (SIGKILL)" or "exited with status 1"."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = "an unknown signal"
    return f"was killed by signal {-status} ({name})"


def say(line: str) -> None:
    """A line on stderr at once, secrets masked (from a watching thread: the CLI's own lines come from the command)."""
    sys.stderr.write(redact(line) + "\n")
    sys.stderr.flush()


class Service:
    """A command run as a service: its output copied to `log` (and its last lines kept, so that they can be shown
    even when the log cannot be written, as on a full disk), watched until trainflow stops it."""

    def __init__(
        self, cmd: list[str], log: Path, name: str, env: dict | None = None, echo: bool = False, nice: int = 0
    ):
        self.cmd, self.log, self.name, self.env, self.echo, self.nice = cmd, log, name, env, echo, nice
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)
        self.unwritten: OSError | None = None
        self.stopping = threading.Event()
        self.death: str | None = None  # why it is gone, once it has died unexpectedly
        self.proc = self.start()

    def start(self) -> subprocess.Popen:
        """Spawn the command; a thread copies its output to the log (unbuffered: a full disk fails a write, which is
        noted, not the close)."""
        out = open(self.log, "ab", buffering=0)  # noqa: SIM115 - the copying thread closes it
        self.proc = spawn(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env)
        self.copier = threading.Thread(target=self.copy_output, args=(self.proc.stdout, out), daemon=True)
        self.copier.start()
        self.pid = self.child()
        return self.proc

    def yield_cpu(self) -> None:
        """Every thread of the service `nice` steps below trainflow's CPU priority (nice(2)), however often it is
        called; threads it starts later inherit it. Linux's /proc lists the threads; a thread that ended meanwhile, or
        no /proc, is passed over."""
        if not self.nice:
            return
        try:
            threads = [int(tid) for tid in os.listdir(f"/proc/{self.pid}/task")]
        except OSError:
            return
        lowered = min(19, os.nice(0) + self.nice)
        for tid in threads:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, max(lowered, os.getpriority(os.PRIO_PROCESS, tid)))
            except OSError:
                pass

    def copy_output(self, pipe: IO[bytes], out: IO[bytes]) -> None:
        """Append each line of output to the log and to the kept lines, until the service closes its output."""
        with pipe, out:
            for line in iter(pipe.readline, b""):
                self.lines.append(line.decode(errors="replace").rstrip())
                if self.echo:  # a server in the foreground: its output is the user's
                    sys.stdout.write(line.decode(errors="replace"))
                    sys.stdout.flush()
                try:
                    out.write(line)
                except OSError as exc:
                    self.unwritten = exc

    def child(self, seconds: float = 5) -> int:
        """The service's own process: the leash's child, once the leash has started it (the leash if it never does)."""
        deadline = time.monotonic() + seconds
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            except OSError:
                break
            if children:
                return int(children[0])
            time.sleep(0.01)
        return self.proc.pid

    def tail(self) -> str:
        """The last lines of its log, on one line."""
        self.copier.join(timeout=2)  # the output after it ended
        lines = " | ".join(line.strip() for line in self.lines if any(c.isalnum() for c in line))  # not a ^^^ line
        lost = f" (not all written to {self.log}: {self.unwritten.strerror})" if self.unwritten else ""
        if not lines:
            return f"{self.log} is empty{lost}"
        return f"last lines of {self.log}{lost}: {lines[-600:]}"

    def exited(self, code: int) -> str:
        """What the user is told when it exits unexpectedly."""
        when = time.strftime("%H:%M:%S")
        return f"{self.name} (started by trainflow, pid {self.pid}) {ended(code)} at {when}; {self.tail()}"


# The endpoints (host:port) of the services running now that their clients check (`death_at`).
ENDPOINTS: dict[str, Service] = {}


def death_at(endpoint: str) -> ServiceDied | None:
    """The fault of the service trainflow started at `endpoint` (host:port), if it has died; else None."""
    service = ENDPOINTS.get(endpoint)
    return ServiceDied(service.death) if service and service.death else None


def wait_until(ready: Callable[[], bool], service: Service, seconds: float, error=ServiceError) -> None:
    """Return once `ready()` holds, the service lowered to its CPU priority; raise `error` if the process exits first
    or time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if service.proc.poll() is not None:
            raise error(f"{service.name} {ended(service.proc.returncode)} at start-up; {service.tail()}")
        if ready():
            service.yield_cpu()
            return
        time.sleep(0.1)
    raise error(f"{service.name} did not start within {seconds:.0f} s; {service.tail()}")


@contextmanager
def running_service(
    cmd: list[str],
    log: Path,
    ready: Callable[[], bool],
    name: str,
    seconds: float,
    error=ServiceError,
    env: dict | None = None,
    endpoint: str | None = None,
    advice: str = "re-run the command",
    restarted: str | None = None,
    nice: int = 0,
) -> Iterator[Service]:
    """`cmd` as a service for the block, its output appended to `log`: yields once `ready()` holds, stops it after.
    If it exits before then, the user is told at once; with `restarted` (what the line adds, e.g. where it serves),
    it is started again, else its `endpoint`'s calls fail with the fault, which ends in `advice`. `nice`: how far
    below trainflow's CPU priority it runs."""
    log.parent.mkdir(parents=True, exist_ok=True)
    service = Service(cmd, log, name, env, nice=nice)
    try:
        wait_until(ready, service, seconds, error)
        if endpoint:
            ENDPOINTS[endpoint] = service
        on_death = restart(ready, seconds, restarted, advice) if restarted else give_up(advice)
        threading.Thread(target=watch, args=(service, on_death), daemon=True).start()
        yield service
    finally:
        service.stopping.set()
        ENDPOINTS.pop(endpoint or "", None)
        stop(service.proc)


def watch(service: Service, on_death: Callable[[Service, int], bool]) -> None:
    """Wait on the service; when it exits and trainflow did not stop it, hand it to `on_death` (which says whether it
    runs again, to be watched again)."""
    while not service.stopping.is_set():
        code = service.proc.wait()
        if service.stopping.is_set() or stopping(within=STOPPING_GRACE):
            service.death = f"{service.exited(code)} as the command stopped"
            return
        if not on_death(service, code):
            return


def give_up(advice: str) -> Callable[[Service, int], bool]:
    """On an unexpected exit: say so, and make it the fault of the calls to its endpoint."""

    def dead(service: Service, code: int) -> bool:
        line = service.exited(code)
        service.death = f"{line}; {advice}"
        say(line)
        return False

    return dead


def restart(ready: Callable[[], bool], seconds: float, where: str, advice: str) -> Callable[[Service, int], bool]:
    """On an unexpected exit: say so and start it again; if it does not come back, say that and end the command."""

    def again(service: Service, code: int) -> bool:
        say(f"{service.exited(code)}; restarting it {where}")
        started = time.monotonic()
        try:
            service.start()
            wait_until(ready, service, seconds)
        except (OSError, ServiceError) as exc:
            if service.stopping.is_set():  # stopped by trainflow while it started again
                return False
            say(f"error: {service.name} did not restart ({exc}); the command stops here, and all it started; {advice}")
            sys.stdout.flush()
            # The command cannot go on without it, nor stop in order: Prefect's client would retry the dead API for
            # minutes to record the crash. The leash on each service and launcher stops them as this process goes.
            os._exit(1)
        if service.stopping.is_set():
            stop(service.proc)
            return False
        say(f"{service.name} restarted {where} in {time.monotonic() - started:.0f} s")
        return True

    return again


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
