"""The workdir: checked once at the command line, and held by one command at a time.

Everything a run keeps on this machine lives under the workdir (Azurite's data, the file share and file
server folders, Prefect's database, runs, pools), so two commands that start services on one workdir (two
Azurites on one data folder, two uploads of the same shards) would damage each other. A command that starts
services takes the workdir's lock first; a second one is refused at once, with a line naming the first. A lock left
by a command that was killed is taken over, with a line naming that command.
"""

import fcntl
import json
import os
import shlex
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from infra.core.errors import BadInput
from infra.core.redact import redact
from nodelib.folders import cannot_write_in, nearest_existing

LOCK_FILE = "trainflow.lock"
_held: set[Path] = set()  # workdirs this process holds: the flow, run in the command's process, takes them again


class WorkdirError(BadInput):
    """A workdir that cannot be used, or that another command holds."""


def check_workdir(path: Path, writes: bool = True) -> Path:
    """`path` made absolute; refused unless it is, or could be made, a folder this user can write (`writes`: the
    command writes there; one that only reads it, such as `runs` or a dry run, needs a folder or nothing). Creates
    nothing (a dry run leaves no trace)."""
    path = path.expanduser().absolute()
    nearest = nearest_existing(path)
    if not nearest.is_dir():
        raise WorkdirError(f"workdir {path}: {nearest} is a file, not a folder; pass --workdir DIR (a folder)")
    if writes and (why := cannot_write_in(nearest)):
        raise WorkdirError(
            f"workdir {path}: cannot write in {nearest} ({why}); pass --workdir DIR that you can write to"
        )
    return path


def command_line() -> str:
    """This process's command line as the user typed it (to name it, or to repeat it): `trainflow ...`, or `python
    -m cli ...` (whose argv[0] is the package's __main__.py)."""
    program = Path(sys.argv[0])
    typed = ["python", "-m", program.parent.name] if program.name == "__main__.py" else [program.name]
    return shlex.join([*typed, *sys.argv[1:]])


def holder_line(record: dict) -> str:
    """Who holds a workdir, in words."""
    return (
        f"`{record.get('command', '?')}` (pid {record.get('pid', '?')} on {record.get('host', '?')}, "
        f"since {record.get('since', '?')})"
    )


@contextmanager
def workdir_lock(workdir: Path) -> Iterator[None]:
    """Hold `workdir` for the block, or refuse at once naming the command that holds it. Re-entrant in a process."""
    workdir = workdir.resolve()
    if workdir in _held:
        yield
        return
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / LOCK_FILE, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise WorkdirError(
                f"workdir {workdir} is in use by {holder_line(read_record(lock.read()))}; wait for it "
                "to end, or pass another --workdir"
            ) from None
        lock.seek(0)
        if left := read_record(lock.read()):
            say_reclaimed(workdir, left)
        lock.truncate(0)
        lock.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": f"{datetime.now():%H:%M:%S}",
                    "command": redact(command_line()),
                }
            )
        )
        lock.flush()
        _held.add(workdir)
        try:
            yield
        finally:
            _held.discard(workdir)
            lock.truncate(0)


def say_reclaimed(workdir: Path, record: dict) -> None:
    """One line on stderr for a lock whose holder ended without releasing it (a command that ends, even by an
    exception or an interrupt, empties the file; one killed, or on a machine that went down, cannot)."""
    pid = record.get("pid")
    gone = isinstance(pid, int) and record.get("host") == socket.gethostname() and not pid_alive(pid)
    how = "which is no longer running" if gone else "which ended without releasing it"
    sys.stderr.write(f"workdir {workdir} was left locked by {holder_line(record)}, {how} (killed?); reclaimed\n")
    sys.stderr.flush()


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this machine (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_record(text: str) -> dict:
    """The lock file's record (empty if unreadable: the holder is between its lock and its write)."""
    try:
        return json.loads(text)
    except ValueError:
        return {}
