"""A job that has gone quiet: no line from any rank for job.silent_s seconds, or Horovod's stall warning (a collective
that some ranks never joined), ends its attempt naming the silent ranks, instead of waiting until job.timeout_s."""

import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from infra.engines.launchers import LaunchError
from nodelib.records import line_rank

# Horovod's stall inspector (horovod/common/stall_inspector.cc) logs "One or more tensors were submitted to be reduced,
# gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for more than 60 seconds. ...",
# then "Missing ranks:", then a line "N: [tensor, ...]" for each rank that never submitted.
HOROVOD_STALL = "Missing ranks:"
HOROVOD_MISSING = re.compile(r"^\s*(\d+): \[")


class JobHung(LaunchError):
    """The job printed nothing for job.silent_s, or Horovod saw a rank stall: it was stopped. Not retried: a job
    that hangs hangs again more often than not (a deadlock, a rank waiting on a collective the others skipped)."""

    permanent = True


@dataclass
class Silence:
    """The watch over a job's lines: when each rank last printed, and whether the watch stopped the job."""

    silent_s: float
    stop: Callable[[], None]
    last: dict[int, float] = field(default_factory=dict)
    heard: float = field(default_factory=time.monotonic)
    why: str = ""
    stalled: bool = False
    missing: set[int] = field(default_factory=set)  # the ranks Horovod named as missing
    done: threading.Event = field(default_factory=threading.Event)

    def lines(self, lines: Iterator[str]) -> Iterator[str]:
        """The job's lines as they come, each noted; a stall warning of Horovod's ends the job."""
        for line in lines:
            now = self.heard = time.monotonic()
            ranked = line_rank(line)
            if ranked:
                self.last[ranked[0]] = now
            text = ranked[1].split("] ", 1)[-1] if ranked else line
            if self.stalled and (missing := HOROVOD_MISSING.match(text)):
                self.missing.add(int(missing.group(1)))
            if HOROVOD_STALL in line and not self.why:
                self.stalled = True
                self.end("Horovod saw a collective that some ranks never joined")
            yield line

    def watch(self) -> None:
        """Until the job ends: stop it once no line came for silent_s."""
        while not self.done.wait(min(1.0, self.silent_s)):
            if time.monotonic() - self.heard >= self.silent_s and not self.why:
                self.end(f"no line from any rank for {self.silent_s:g} s")

    def end(self, why: str) -> None:
        """Stop the job, saying why."""
        self.why = why
        self.stop()

    def error(self, failure: LaunchError) -> JobHung:
        """The error of a job this watch stopped: why, and when each rank last printed."""
        now = time.monotonic()
        if self.missing:
            ranks = f"missing ranks {', '.join(map(str, sorted(self.missing)))}"
        else:
            ranks = "; ".join(f"rank {r} last printed {now - at:.0f} s ago" for r, at in sorted(self.last.items()))
        return JobHung(
            f"the job was stopped as hung: {self.why} ({ranks or 'no rank printed anything'}); find where it waits in "
            f"the ranks' logs, or raise job.silent_s. {failure}"
        )


def watched(silent_s: float, stop: Callable[[], None]) -> Silence | None:
    """A started watch over a job (None with silent_s 0: none)."""
    if not silent_s:
        return None
    silence = Silence(silent_s, stop)
    threading.Thread(target=silence.watch, name="job-silence", daemon=True).start()
    return silence
