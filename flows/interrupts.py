"""One way every command ends on an interrupt: Ctrl-C (SIGINT to the terminal's process group), SIGTERM or SIGHUP.

The first interrupt raises KeyboardInterrupt in the command, so each `finally` on the way out runs: the job
cancels its workers, the flow deletes its pool, Azurite and Prefect's server stop (they run in sessions of
their own, so the terminal's Ctrl-C reaches only trainflow, which stops them in order, and Prefect records
the flow run as crashed). The command then prints one line: what was interrupted and how to resume. A second
interrupt exits at once; the leash on each service and launcher (infra/services/leash.py) stops them as this process
goes.

Closing the terminal is a stop too (SIGHUP; under `nohup`, which ignores it, the command goes on). The terminal is
gone then, so the command's output goes to /dev/null from that moment: a write to the dead terminal would fail
(EIO) in whatever step made it. Once any interrupt came, no step is retried and no service restarted
(infra/core/stopping.py).
"""

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType

from infra.core.stopping import STOPPING

INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command that Ctrl-C ended


@contextmanager
def stop_on_interrupt(say: Callable[[str], None]) -> Iterator[None]:
    """Handle interrupts as above for the block (only the main thread can)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def at_once(signum, frame) -> None:
        quietly(say, "interrupted again: exiting now; the services and workers this command started stop with it")
        os._exit(EXIT_INTERRUPTED)

    def first(signum, frame) -> None:
        STOPPING.set()
        for sig in previous:
            signal.signal(sig, at_once)
        if signum == signal.SIGHUP:
            detach_from_terminal()
        quietly(
            say,
            f"{signal.Signals(signum).name}: stopping the workers, the pool and the services "
            "(interrupt again to exit at once)",
        )
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, first) for sig in handled()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def handled() -> list[signal.Signals]:
    """The interrupts this command stops on: all, but a hang-up that `nohup` (or a caller) set to be ignored."""
    return [sig for sig in INTERRUPTS if not (sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN)]


def quietly(say: Callable[[str], None], line: str) -> None:
    """Say `line` if the output can take it: a failed write must not replace the interrupt."""
    try:
        say(line)
    except (OSError, ValueError):  # a terminal gone (EIO), a closed pipe or stream
        pass


def detach_from_terminal() -> None:
    """Point standard output and error at /dev/null: the terminal they wrote to is closed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)


def interrupted_step(tb: TracebackType | None) -> str | None:
    """The innermost Prefect task or flow the interrupt came through (its name), if any."""
    step = None
    while tb is not None:
        frame = tb.tb_frame
        runnable = frame.f_globals.get(frame.f_code.co_name)
        if runnable is not None and getattr(getattr(runnable, "fn", None), "__code__", None) is frame.f_code:
            step = runnable.name
        tb = tb.tb_next
    return step


# The commands that keep what they did, and what a re-run of one skips (the others start over)
TRAINING = "finished steps are skipped and training continues from its last checkpoint"
RESUMES = {"run": TRAINING, "train": TRAINING, "smoke": TRAINING, "stage": "finished steps are skipped"}


def interrupted_line(exc: KeyboardInterrupt, command: str, variables: Sequence[str] = ()) -> str:
    """The one line an interrupted command ends with: what was interrupted and how to resume (with the setting
    `variables` of the environment named, not their values: changed, they would start a new run)."""
    step = interrupted_step(exc.__traceback__)
    where = f" during {step}" if step else ""
    notes = getattr(exc, "__notes__", [])  # how to resume, where the command said (`train`'s --out)
    resume = next(iter(notes), f"run `{command}` again")
    same = f", with {', '.join(variables)} set as now" if variables else ""
    verb = next((word for word in command.split()[:4] if word in RESUMES), "train" if notes else "")
    if not verb:  # predict, runs, doctor...: nothing of theirs is kept to resume from
        return f"interrupted{where}: everything it started is stopped; to start over, {resume}"
    return f"interrupted{where}: everything it started is stopped; to resume, {resume}{same} ({RESUMES[verb]})"
