"""The time of each attempt at a run's training, kept on disk as it goes: a run killed outright (kill -9, the OOM
killer, a lost machine) writes nothing at its end, yet the time its pool was held still counts in its ledger.

attempts.json in the run folder lists every attempt (each try of run-training, in each flow run that worked on the
run): its flow run, the process driving it, when it started, when it was last seen alive, and how it ended:
completed, failed, interrupted (Ctrl-C), or running while it runs. While an attempt runs, a thread of the process
that drives the job rewrites its `seen` every HEARTBEAT_S seconds. An attempt that still says running after its
process is gone was killed: it counts up to its last heartbeat, at most HEARTBEAT_S short of its death.

Why a heartbeat of our own and not the trainer's files: the trainer's checkpoints and its wall_seconds stop at the
last checkpoint (minutes before a kill, or nothing for a job killed before its first), and its log lines stop
whenever the job is quiet (start-up, a long validation, a hung rank); the pool is held, and billed, the whole time
the job is driven, and only the driver sees all of that time.
"""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.compute.base import owner, owner_alive
from infra.core.jsonfiles import read_json, write_json
from infra.core.stopping import failed

ATTEMPTS = "attempts.json"
HEARTBEAT_S = 1.0


def read_attempts(out: Path) -> list[dict]:
    """The run's attempts in order, each with its seconds; one that says running but whose process is gone ended
    killed, at its last heartbeat."""
    return [settled(a) for a in read_json(out / ATTEMPTS).get("attempts", [])]


def settled(attempt: dict) -> dict:
    """An attempt as it stands: killed if its process is gone while it says running; its seconds so far."""
    if attempt["ended"] == "running" and not owner_alive(attempt["owner"]):
        attempt = {**attempt, "ended": "killed"}
    return {**attempt, "seconds": round(attempt["seen"] - attempt["started"], 2)}


def brief(attempt: dict) -> dict:
    """An attempt in three fields, as the receipt and `trainflow runs` show it: its number, how it ended, its
    seconds."""
    return {key: attempt[key] for key in ("attempt", "ended", "seconds")}


@contextmanager
def timed_attempt(out: Path, flow_run: str, heartbeat_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Record an attempt of the run in `out` for the block: started now, seen every `heartbeat_s` while the block
    runs, and how the block ended."""
    done = threading.Event()
    number = len(read_json(out / ATTEMPTS).get("attempts", [])) + 1
    now = time.time()
    attempt = {"attempt": number, "flow_run": flow_run, "owner": owner(), "started": now, "seen": now}
    save = lambda ended: save_attempt(out, {**attempt, "seen": time.time(), "ended": ended})  # noqa: E731 - a one-line helper, read where it is used
    save("running")
    beat = threading.Thread(target=heartbeat, args=(save, done, heartbeat_s), name="attempt-heartbeat", daemon=True)
    beat.start()
    ended = "failed"
    try:
        yield
        ended = "completed"
    except BaseException as exc:
        ended = "failed" if failed(exc) else "interrupted"
        raise
    finally:
        done.set()
        beat.join()
        save(ended)


def heartbeat(save, done: threading.Event, every: float) -> None:
    """Say the attempt still runs every `every` seconds until `done`; a beat that cannot be written (a full disk,
    whatever the writer calls it) is skipped: the next one, or the attempt's end, writes it. A beat never stops the
    job, nor prints a thread's traceback."""
    while not done.wait(every):
        try:
            save("running")
        except Exception:
            pass


def save_attempt(out: Path, attempt: dict) -> None:
    """Replace this attempt's entry in attempts.json (added at its place if new); the others stay as they were. One
    writer at a time: the heartbeat ends before the attempt's last word."""
    attempts = read_json(out / ATTEMPTS).get("attempts", [])
    kept = [a for a in attempts if a["attempt"] != attempt["attempt"]]
    write_json(out / ATTEMPTS, {"attempts": sorted([*kept, attempt], key=lambda a: a["attempt"])})
