"""The one interrupt path (SIGINT, SIGTERM and SIGHUP alike; a second exits at once; a closed terminal is a hang-up)
and the workdir's lock, each in a process of its own as a command runs them."""

import subprocess
import sys
from pathlib import Path

import pytest

from flows.config import setting_variables_in
from flows.interrupts import interrupted_line
from infra.runs.workdir import command_line
from tests.fakes.terminal import Terminal

TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
INTERRUPTED = """
import os, signal, sys, time
from flows.interrupts import interrupted_line, stop_on_interrupt
with stop_on_interrupt(print):
    try:
        os.kill(os.getpid(), signal.{sig})
        time.sleep(5)
    except KeyboardInterrupt as exc:
        exc.add_note("run `trainflow train --out OUT`")
        print(interrupted_line(exc, "trainflow x"))
        {then}
"""
HUNG_UP = """
import sys, time
from pathlib import Path
from flows.interrupts import stop_on_interrupt
with stop_on_interrupt(print):
    try:
        while True:
            print("tick", flush=True)
            time.sleep(0.05)
    except KeyboardInterrupt:
        print("the terminal is gone: this goes nowhere, and fails nothing", flush=True)
        Path(sys.argv[1]).write_text("interrupted")
"""
NOHUP = """
import os, signal, time
from flows.interrupts import stop_on_interrupt
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts a command
with stop_on_interrupt(print):
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(0.2)
    print("went on")
"""
HOLD = (
    "import sys, time; from pathlib import Path; from infra.runs.workdir import workdir_lock\n"
    "with workdir_lock(Path(sys.argv[1])), workdir_lock(Path(sys.argv[1])):\n"  # re-entrant in a process
    "    print('held', flush=True); time.sleep(60)"
)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_each_interrupt_stops_the_command_through_the_same_path(sig):
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED.format(sig=sig, then="pass")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{sig}: stopping the workers, the pool and the services (interrupt again to exit at once)",
        "interrupted: everything it started is stopped; to resume, run `trainflow train --out OUT` (finished steps "
        "are skipped and training continues from its last checkpoint)",
    ]


def test_a_command_that_keeps_nothing_is_not_said_to_resume():
    """`predict` (or `runs`, `doctor`) interrupted starts over; `stage` skips its finished steps; `run` also resumes
    its training."""
    line = interrupted_line(KeyboardInterrupt(), "trainflow predict photos --model abc")
    said = "interrupted: everything it started is stopped; to start over, run `trainflow predict photos --model abc`"
    assert line == f"{said} again"
    stage = interrupted_line(KeyboardInterrupt(), "trainflow stage --data d")
    assert stage.endswith("again (finished steps are skipped)")
    assert interrupted_line(KeyboardInterrupt(), "trainflow run --data d").endswith("from its last checkpoint)")


def test_a_closed_terminal_is_an_interrupt_and_the_output_after_it_fails_nothing(tmp_path):
    terminal = Terminal([sys.executable, "-c", HUNG_UP, str(tmp_path / "end")])
    terminal.read_until("tick")
    terminal.close()
    assert terminal.proc.wait(timeout=30) == 0  # no OSError (EIO) from the prints after the hang-up
    assert (tmp_path / "end").read_text() == "interrupted"


def test_a_hang_up_that_nohup_ignores_stays_ignored():
    done = subprocess.run([sys.executable, "-c", NOHUP], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "went on\n", done.stderr


def test_a_second_interrupt_exits_at_once_with_status_130():
    then = "os.kill(os.getpid(), signal.SIGINT); time.sleep(5); print('not reached')"
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED.format(sig="SIGINT", then=then)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 130 and "not reached" not in done.stdout
    assert "interrupted again: exiting now" in done.stdout


@pytest.fixture
def held(tmp_path):
    """tmp_path/a held by another process, as a running command holds its workdir."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "a")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    yield tmp_path / "a", holder.pid
    holder.kill()
    holder.wait()


def test_a_held_workdir_is_refused_to_another_process_naming_it_and_another_workdir_is_free(held):
    workdir, pid = held
    code = (
        "import sys; from pathlib import Path; from infra.runs.workdir import workdir_lock\n"
        "with workdir_lock(Path(sys.argv[1])): print('got it')"
    )
    other = subprocess.run([sys.executable, "-c", code, str(workdir.with_name("b"))], capture_output=True, text=True)
    assert other.stdout == "got it\n"
    same = subprocess.run([sys.executable, "-c", code, str(workdir)], capture_output=True, text=True)
    assert same.returncode == 1 and f"WorkdirError: workdir {workdir} is in use by `" in same.stderr
    assert f"(pid {pid} on " in same.stderr


def test_a_dry_run_takes_no_lock(held):
    workdir, _ = held
    done = subprocess.run(
        [TRAINFLOW, "run", "--dry-run", "--workdir", str(workdir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "argv, typed",
    [
        (["/venv/bin/trainflow", "run", "--data", "my photos"], "trainflow run --data 'my photos'"),
        (["/repo/cli/__main__.py", "run", "--dry-run"], "python -m cli run --dry-run"),
    ],
)
def test_the_command_line_is_named_as_it_was_typed(monkeypatch, argv, typed):
    monkeypatch.setattr(sys, "argv", argv)
    assert command_line() == typed


def test_the_resume_line_names_the_setting_variables_to_keep():
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        variables = setting_variables_in(
            {"TRAINFLOW_TRAINING__EPOCHS": "3", "TRAINFLOW_TEST_FREE_GIB": "1", "HOME": "/"}
        )
        line = interrupted_line(exc, "trainflow run", variables)
    assert line.startswith(
        "interrupted: everything it started is stopped; to resume, run `trainflow run` again, with "
        "TRAINFLOW_TRAINING__EPOCHS set as now (finished steps"
    )
