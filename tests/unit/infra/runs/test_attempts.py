"""The time of each attempt at a run's training, on disk as it goes: how each ended, and a killed one counted up to
its last heartbeat (a real process, killed with SIGKILL)."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from infra.runs.attempts import heartbeat, read_attempts, timed_attempt

KILLED_MID_ATTEMPT = """
import sys, time
from pathlib import Path
from infra.runs.attempts import timed_attempt
with timed_attempt(Path(sys.argv[1]), "flow-1", heartbeat_s=0.2):
    print("started", flush=True)
    time.sleep(600)
"""


def test_each_attempt_says_how_it_ended_and_how_long_it_took(tmp_path):
    with timed_attempt(tmp_path, "flow-1", heartbeat_s=0.05):
        time.sleep(0.3)
    with pytest.raises(ValueError), timed_attempt(tmp_path, "flow-1", heartbeat_s=0.05):
        raise ValueError("the job failed")
    with pytest.raises(KeyboardInterrupt), timed_attempt(tmp_path, "flow-2"):
        raise KeyboardInterrupt
    attempts = read_attempts(tmp_path)
    assert [(a["attempt"], a["flow_run"], a["ended"]) for a in attempts] == [
        (1, "flow-1", "completed"),
        (2, "flow-1", "failed"),
        (3, "flow-2", "interrupted"),
    ]
    assert 0.3 <= attempts[0]["seconds"] < 1.0 and attempts[2]["seconds"] < 0.5


def test_an_attempt_killed_outright_counts_up_to_its_last_heartbeat(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_MID_ATTEMPT, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"
        time.sleep(2.0)
        [running] = read_attempts(tmp_path)
        assert running["ended"] == "running" and 1.4 < running["seconds"] <= 2.0  # seen while it runs
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.time()
        proc.wait()
    [killed] = read_attempts(tmp_path)
    lived = killed_at - killed["started"]
    assert killed["ended"] == "killed"
    assert lived - 0.5 < killed["seconds"] <= lived  # heartbeats every 0.2 s: at most that short, and some slack


def test_a_heartbeat_that_cannot_be_written_is_skipped_and_the_beats_go_on():
    beats: list[str] = []

    def full_disk(ended: str) -> None:
        beats.append(ended)
        raise RuntimeError("no space left for attempts.json")  # whatever the writer raises

    done = threading.Event()
    beat = threading.Thread(target=heartbeat, args=(full_disk, done, 0.01))
    beat.start()
    time.sleep(0.2)
    assert beat.is_alive()
    done.set()
    beat.join(1)
    assert not beat.is_alive() and len(beats) > 3
