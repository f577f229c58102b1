"""A full disk, recognised and worded in one place (nodelib/errors.py, infra/core/diskspace.py), is a fault: exit 1,
no retry, one line, also where no writer named it (the CLI's last net)."""

import errno
import sqlite3

import pytest
import typer

from cli.common import friendly_errors
from infra.core.diskspace import DiskFull, Need, check_needs, disk_full, is_disk_full, size_text
from infra.core.errors import exit_code, is_permanent


def wrapped(cause: BaseException) -> Exception:
    """An error a library raised from `cause` (as SQLAlchemy or MLflow wrap SQLite's)."""
    try:
        raise cause
    except BaseException as exc:
        try:
            raise RuntimeError("(sqlalchemy.exc.OperationalError) wrapped") from exc
        except RuntimeError as outer:
            return outer


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        sqlite3.OperationalError("database or disk is full"),
        wrapped(sqlite3.OperationalError("database or disk is full")),
        wrapped(OSError(errno.ENOSPC, "No space left on device")),
        DiskFull("no space left on the disk of /x"),
    ],
    ids=["ENOSPC", "EDQUOT", "sqlite", "sqlite wrapped", "ENOSPC wrapped", "DiskFull"],
)
def test_a_full_disk_is_a_fault_that_is_not_retried(exc):
    assert is_disk_full(exc) and exit_code(exc) == 1 and is_permanent(exc)


@pytest.mark.parametrize(
    "exc", [OSError(errno.EACCES, "Permission denied"), ValueError("x"), sqlite3.OperationalError("locked")]
)
def test_other_errors_are_not_a_full_disk(exc):
    assert not is_disk_full(exc) and exit_code(exc) is None and not is_permanent(exc)


def test_the_line_names_the_path_what_it_needed_and_what_is_free(tmp_path):
    line = str(disk_full(tmp_path / "a" / "b.json", 2_500_000))
    assert line.startswith(f"no space left on the disk of {tmp_path / 'a' / 'b.json'}: writing it needs 2.5 MB, ")
    assert " free there; free space there, or give it a bigger disk" in line
    assert [size_text(n) for n in (812, 340_000, 7_600_000, 2_100_000_000)] == [
        "812 bytes",
        "340 kB",
        "7.6 MB",
        "2.1 GB",
    ]


def test_needs_on_one_disk_are_added_up_before_anything_starts(tmp_path):
    check_needs([Need(tmp_path / "a", 1000, "a"), Need(tmp_path / "b", 1000, "b")], "two things")
    with pytest.raises(DiskFull, match=rf"^no space for two things on the disk of {tmp_path}: it needs .* \(a .*, b "):
        check_needs([Need(tmp_path / "a", 1 << 60, "a"), Need(tmp_path / "b", 1, "b")], "two things")


def test_a_full_disk_no_writer_named_still_ends_the_command_in_one_line(capsys):
    """Before: exit_code() said "a bug" and the CLI showed the OSError's traceback."""

    @friendly_errors
    def command():
        raise OSError(errno.ENOSPC, "No space left on device", "/w/results/plot.svg")

    with pytest.raises(typer.Exit) as ended:
        command()
    assert ended.value.exit_code == 1
    assert capsys.readouterr().err.strip() == (
        "error: the disk of /w/results/plot.svg is full; free space there, or pass --workdir on a bigger disk"
    )
