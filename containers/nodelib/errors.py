"""The error types the training engine reports as a one-line message instead of a traceback, and the one place a
full disk is recognised and worded (the orchestrator's writers use it too, through infra/core/diskspace.py)."""

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class UsageError(Exception):
    """Bad input from the user: the message names what is wrong and how to fix it."""


class UntrustedInput(UsageError):
    """What came back from storage breaks the rules of its format (a manifest row that climbs out of its folder, a tar
    member that is a link, a scripts file that is not the one its version was named after): never used, never
    retried; the message names the data set or folder, the row or file, what is wrong, and the fix."""


class DiskFull(Exception):
    """A write the disk has no room for (a fault, not bad input): the message names the path, the bytes it needed
    and the bytes free there."""


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether an error is a full disk or quota: DiskFull, ENOSPC or EDQUOT, or SQLite's "database or disk is
    full", also where a library wrapped it in an error of its own (SQLAlchemy, MLflow)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, DiskFull) or (isinstance(exc, OSError) and exc.errno in FULL_ERRNOS):
            return True
        if "database or disk is full" in str(exc):  # SQLITE_FULL, as sqlite3 and the errors that quote it say
            return True
        exc, seen = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__), seen + 1
    return False


def free_bytes(path: Path) -> int:
    """The bytes free to this process on the disk that holds `path` (its nearest existing folder)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def size_text(n: int) -> str:
    """Bytes for a person: 812 bytes, 340 kB, 7.6 MB, 2.1 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{0 if unit == 'kB' else 1}f} {unit}"
    return f"{n} bytes"


def disk_full(path: Path, need: int | None, written: int = 0, fix: str = "") -> DiskFull:
    """The one line for a write that does not fit: the path, what it needed (or had written when the disk filled),
    what is free there, and the fix."""
    wanted = f"writing it needs {size_text(need)}" if need else "the disk filled while writing it"
    if written and not need:
        wanted = f"writing it needs more than the {size_text(written)} it had written"
    return DiskFull(
        f"no space left on the disk of {path}: {wanted}, {size_text(free_bytes(path))} free there; "
        f"{fix or 'free space there, or give it a bigger disk'}"
    )


def check_free(path: Path, need: int, fix: str = "") -> None:
    """Refuse a write of `need` bytes to `path` before it starts when the disk there has less free."""
    if need > free_bytes(path):
        raise disk_full(path, need, fix=fix)


def size_of(path: Path | None) -> int:
    """The bytes a file or folder holds (0 when there is none)."""
    if path is None or not os.path.lexists(path):
        return 0
    if not path.is_dir():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())


def remove(path: Path | None) -> None:
    """Delete a partial file or folder, if there is one."""
    if path is not None and path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path is not None:
        path.unlink(missing_ok=True)


@contextmanager
def writing(path: Path, need: int | None = None, partial: Path | None = None, fix: str = "") -> Iterator[None]:
    """A full disk met in the block becomes DiskFull naming `path` and the bytes it needed (`need`, else what
    `partial` held when the disk filled); `partial`, the block's unfinished file or folder, is removed."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, DiskFull) or not is_disk_full(exc):
            raise  # not a full disk, or one already named by the writer inside
        written = size_of(partial)
        remove(partial)
        raise disk_full(path, need, written, fix) from None


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name (the trainer's and the orchestrator's one)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
