"""Disk space on the orchestrator's side: a full disk is a fault (exit 1, no retry) told in one line that names the
path, the bytes needed and the bytes free there; where the need is known before a step starts, it is checked first.

The translation of ENOSPC, EDQUOT and SQLite's "database or disk is full" is the trainer's (nodelib/errors.py,
which the nodes run too); every writer here wraps its write in `writing(path, ...)`, and the CLI's last net
(cli/common.py) words one that reaches it unnamed with `unnamed_full_disk`.
"""

import os
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import NamedTuple

from nodelib import errors
from nodelib.errors import DiskFull, check_free, disk_full, free_bytes, is_disk_full, size_text

__all__ = ["DiskFull", "check_free", "disk_full", "free_bytes", "is_disk_full", "size_text", "writing"]

MOVE = "pass --workdir on a bigger disk"
WORKDIR_FIX = f"free space there, or {MOVE}"
PREFECT_FIRST_START = 6_000_000  # Prefect's database while its first start migrates it: 4.9 MB measured, 1.4 MB after
PREFECT_GROWTH = 1_000_000  # what one more command's runs, logs and events add to it, about


def writing(
    path: Path, need: int | None = None, partial: Path | None = None, fix: str = WORKDIR_FIX
) -> AbstractContextManager[None]:
    """nodelib/errors.py's `writing` (a full disk met in the block as one line naming `path`), the workdir's fix."""
    return errors.writing(path, need, partial, fix)


class Need(NamedTuple):
    """Bytes a step will write under a folder, and what they are (for the line)."""

    place: Path
    bytes: int
    what: str


def existing(path: Path) -> Path:
    """`path`, or its nearest folder that exists (where a folder not yet made will live)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_needs(needs: Iterable[Need], doing: str, move: str = MOVE) -> None:
    """Refuse, before anything starts, the first disk whose free space is less than what `needs` put on it."""
    disks: dict[int, list[Need]] = {}
    for need in needs:
        if need.bytes > 0:
            disks.setdefault(os.stat(existing(need.place)).st_dev, []).append(need)
    for on_disk in disks.values():
        total, free = sum(n.bytes for n in on_disk), free_bytes(on_disk[0].place)
        if total > free:
            where = Path(os.path.commonpath([str(n.place.absolute()) for n in on_disk]))
            parts = ", ".join(f"{n.what} {size_text(n.bytes)}" for n in on_disk)
            raise DiskFull(
                f"no space for {doing} on the disk of {where}: it needs {size_text(total)} ({parts}), "
                f"{size_text(free)} free there; free {size_text(total - free)} more there, or {move}"
            )


def prefect_need(home: Path) -> Need:
    """What Prefect's server will write to its database in `home`: its first start migrates a new one."""
    first = not (home / "prefect.db").exists()
    return Need(home, PREFECT_FIRST_START if first else PREFECT_GROWTH, "Prefect's database")


def check_prefect_space(home: Path) -> None:
    """Refuse to start Prefect's server where its database has no room (it would exit at start-up, log unwritten)."""
    check_needs([prefect_need(home)], "Prefect's server")


def unnamed_full_disk(exc: BaseException) -> str:
    """The line for a full disk no writer named: the file the error names, if any, and the fix."""
    path = getattr(exc, "filename", None)
    where = f"the disk of {path} is full" if path else f"a disk trainflow writes to is full ({exc})"
    return f"{where}; {WORKDIR_FIX}"
