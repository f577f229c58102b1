"""A run's training job as attempts: each its own Azure ML job; a pre-empted or failed one is followed by the next
(which resumes from the checkpoints all attempts keep in one Blob datastore path) while attempts and GPU-hours last;
its logs streamed, its statuses mapped, the work each lost counted.
"""

import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from infra.compute.azureml.settings import AzureMLPoolConfig
from infra.core.errors import first_line
from infra.engines.launchers import LaunchError
from nodelib.records import Checkpointed, Failure, Progress, read_event

# Azure ML job statuses that end a job, and the exit status each maps to.
FINAL = {"Completed": 0, "Failed": 1, "Canceled": 1, "NotResponding": 1}
ERROR_MESSAGE = re.compile(r'"message":\s*"((?:[^"\\]|\\.)*)"')  # in the error JSON that jobs.stream raises
PREEMPTED = re.compile(r"pre-?empt", re.IGNORECASE)  # "PreemptionError: Nodes of this job got pre-empted"
# The failures of a rank that another attempt would meet again (nodelib/records.py's causes), in words: the run ends
# with the attempt. A script's are told by the rank's own line (the launchers' describe_failure), the rest here.
REFUSED = {
    "input": "the trainer refused its input",
    "usage": "the script refused its input",
    "script": "the script failed (its exit status is not one of script.retry_exit_codes)",
}
SAID_BY_THE_RANK = {"usage", "script"}


class Cluster(Protocol):
    """What a job needs of the cluster client that makes it (cluster.AzureMLPool): its settings and its MLClient."""

    pool: AzureMLPoolConfig

    @property
    def client(self) -> Any: ...


@dataclass
class Attempt:
    """One Azure ML job of a run: how it ended, why, what it cost, and the work it lost."""

    name: str
    gpus: int
    status: str = "Queued"
    why: str = ""
    running_since: float | None = None
    seconds: float = 0.0  # while Running, as the polls saw it
    last_step: int | None = None  # the newest step its log shows
    last_checkpoint: int | None = None  # the newest checkpoint it saved or resumed from
    refused: str = ""  # the cause of a rank's failure that another attempt would meet too (REFUSED), if any
    error: str = ""  # what the job's stream raised (Azure ML's error, e.g. a PreemptionError)

    def read(self, line: str) -> None:
        """Note the progress, checkpoints and failures a line of the job shows (the events of the trainer, of a
        script's rank shim, and of the sync command that refuses staged data)."""
        event = read_event(line)
        if isinstance(event, Progress):
            self.last_step = event.step
        elif isinstance(event, Checkpointed):
            self.last_checkpoint = event.step
        elif isinstance(event, Failure) and event.cause in REFUSED and not self.refused:
            self.refused = event.cause

    def clock(self, status: str, now: float) -> None:
        """Count the time the job spends Running (GPU time) from what each poll sees."""
        if status == "Running" and self.running_since is None:
            self.running_since = now
        elif status != "Running" and self.running_since is not None:
            self.seconds += now - self.running_since
            self.running_since = None

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.gpus / 3600

    @property
    def lost_steps(self) -> int:
        """Steps trained since the attempt's newest checkpoint (none lost when it completed)."""
        if self.status == "Completed" or self.last_step is None:
            return 0
        return max(self.last_step - (self.last_checkpoint or 0), 0)

    def row(self, number: int) -> dict:
        """The attempt in the run summary."""
        return {
            "attempt": number,
            "job": self.name,
            "ended": self.status,
            "why": self.why,
            "minutes": round(self.seconds / 60, 2),
            "gpu_hours": round(self.gpu_hours, 3),
            "last_step": self.last_step,
            "last_checkpoint": self.last_checkpoint,
            "lost_steps": self.lost_steps,
        }


def why_ended(attempt: Attempt) -> str:
    """Why an attempt ended, in words."""
    if attempt.status == "Completed":
        return "completed"
    if PREEMPTED.search(attempt.error):
        return "pre-empted (low-priority nodes taken back)"
    if attempt.refused:
        return REFUSED[attempt.refused]
    message = ERROR_MESSAGE.search(attempt.error)
    return attempt.status.lower() + (f": {message.group(1)[:200]}" if message else "")


@dataclass
class AzureMLJob:
    """A run's job on Azure ML, as attempts: each a command job with its own name; a pre-empted or failed one
    (not bad input, not cancelled) is followed by the next while attempts and GPU-hours last."""

    pool: Cluster
    make_spec: Callable[[int], Any]  # attempt number -> command job
    gpus: int
    on_complete: Callable[[str], None] = lambda name: None
    poll_seconds: float = 10.0
    history: list[Attempt] = field(default_factory=list)
    number: int = 0  # the current attempt's number (counting those of earlier tries of the step)
    code: int | None = None
    failure: str = ""
    _lines: queue.Queue = field(default_factory=queue.Queue, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def client(self):
        return self.pool.client

    @property
    def spec(self):
        """The first attempt's command job (the dry run shows it)."""
        return self.make_spec(1)

    @property
    def name(self) -> str:
        return self.history[-1].name if self.history else ""

    def describe(self) -> str:
        cfg, spec = self.pool.pool, self.spec
        later = (
            (
                f" (then {spec.name.rsplit('-', 1)[0]}-2 ... -{cfg.max_attempts} if pre-empted or failed, each "
                "resuming from the newest checkpoint)"
            )
            if cfg.max_attempts > 1
            else ""
        )
        return f"Azure ML command job {spec.name} on {spec.resources.instance_count} node(s){later}: {spec.command}"

    def check(self) -> None:
        """Nothing to check here: the trainer checks its input on the nodes, where the data is."""

    def submit(self) -> None:
        self.number = self.attempts_before()
        self.submit_attempt()
        threading.Thread(target=self.supervise, daemon=True).start()

    def attempts_before(self) -> int:
        """Attempts of this run already in the workspace (a retry of the Prefect step continues their count)."""
        from azure.core.exceptions import ResourceNotFoundError

        number = 0
        while True:
            try:
                self.client.jobs.get(self.make_spec(number + 1).name)
            except ResourceNotFoundError:
                return number
            number += 1

    def submit_attempt(self) -> None:
        """Submit the next attempt under its own name."""
        self.number += 1
        number = self.number
        name = self.client.jobs.create_or_update(self.make_spec(number)).name
        self.history.append(Attempt(name, self.gpus))
        if number > 1:
            self._lines.put(f"[azureml] attempt {number} submitted as {name}; it resumes from the newest checkpoint\n")

    def supervise(self) -> None:
        """Run attempts until one completes or no new one may start; then end the lines."""
        try:
            while self.code is None:
                attempt = self.history[-1]
                self.follow(attempt)
                self.code = self.after(attempt)
        except Exception as exc:  # the service refused a call: the run fails, saying why
            self._lines.put(f"[azureml] {type(exc).__name__}: {first_line(exc)}\n")
            self.code = 1
        finally:
            self._lines.put(None)

    def follow(self, attempt: Attempt) -> None:
        """Stream an attempt's log and poll its status until it ends."""
        streamer = threading.Thread(target=self.stream, args=(attempt,), daemon=True)
        streamer.start()
        while (status := self.client.jobs.get(attempt.name).status) not in FINAL:
            attempt.clock(status, time.monotonic())
            self._cancelled.wait(self.poll_seconds)
        attempt.clock(status, time.monotonic())
        streamer.join(60)  # its stream ends with the job; what it raised says why the job ended
        attempt.status = status
        attempt.why = why_ended(attempt)

    def stream(self, attempt: Attempt) -> None:
        """The attempt's log lines as Azure ML streams them (jobs.stream prints them; they are caught here)."""

        def emit(line: str) -> None:
            attempt.read(line)
            self._lines.put(line)

        with printed_lines(emit):
            try:
                self.client.jobs.stream(attempt.name)
            except Exception as exc:  # a failed job ends its stream with an exception holding the service's error
                attempt.error = str(exc)

    def after(self, attempt: Attempt) -> int | None:
        """0 when the attempt completed, 1 when the run ends with it, None when a new attempt was submitted."""
        if attempt.status == "Completed":
            self.on_complete(attempt.name)
            return 0
        refused = self.refusal(attempt)
        ended = (
            f"{attempt.name} ended: {attempt.why} after {attempt.last_step or 0} steps, {attempt.lost_steps} "
            "since its last checkpoint" + (f"; {refused}" if refused else "")
        )
        self._lines.put(f"[azureml] {ended}\n")
        if refused:
            self.failure = ended
            return 1
        self.submit_attempt()
        return None

    def refusal(self, attempt: Attempt) -> str | None:
        """Why no new attempt may follow this one, or None."""
        cfg, spent = self.pool.pool, sum(a.gpu_hours for a in self.history)
        if attempt.status == "Canceled" or self._cancelled.is_set():
            return "cancelled: not retried"
        if attempt.refused:
            return f"{'the script failed' if attempt.refused == 'script' else 'bad input'}: not retried"
        if self.number >= cfg.max_attempts:
            return f"no attempts left (pool.max_attempts {cfg.max_attempts})"
        if cfg.max_gpu_hours and spent >= cfg.max_gpu_hours:
            return f"GPU-hours spent: {spent:.2f} of pool.max_gpu_hours {cfg.max_gpu_hours:g}"
        return None

    def lines(self) -> Iterator[str]:
        return iter(self._lines.get, None)

    def poll(self) -> int | None:
        """None while attempts run; 0 when one completed; 1 when a script's rank said why it failed (its line tells
        the run's failure: the launchers' describe_failure); else a failed run raises, saying why its last attempt
        ended (permanent: a retry of the step would only start more attempts than allowed)."""
        if self.code == 1 and self.history and self.history[-1].refused in SAID_BY_THE_RANK:
            return 1
        if self.code == 1:
            raise LaunchError(
                f"Azure ML job {self.failure or 'failed'}; its log is in the run's logs/launcher.log", permanent=True
            )
        return self.code

    def cancel(self) -> None:
        self._cancelled.set()
        if self.history:
            self.client.jobs.begin_cancel(self.name)

    def attempts(self) -> list[dict]:
        """Each attempt: its job, how and why it ended, its GPU-hours, and the steps it lost."""
        return [attempt.row(number) for number, attempt in enumerate(self.history, 1)]


class _ThreadLines:
    """sys.stdout for one thread: its writes become whole lines handed to `emit`; other threads write through."""

    def __init__(self, emit, original, owner: int):
        self.emit, self.original, self.owner, self.pending = emit, original, owner, ""

    def write(self, text: str) -> int:
        if threading.get_ident() != self.owner:
            return self.original.write(text)
        *whole, self.pending = (self.pending + text).split("\n")
        for line in whole:
            self.emit(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, name):
        return getattr(self.original, name)


@contextmanager
def printed_lines(emit) -> Iterator[None]:
    """What this thread prints goes to `emit`, line by line, for the block."""
    original = sys.stdout
    sys.stdout = _ThreadLines(emit, original, threading.get_ident())
    try:
        yield
    finally:
        if sys.stdout.pending:
            emit(sys.stdout.pending + "\n")
        sys.stdout = original
