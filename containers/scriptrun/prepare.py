"""A script run's folders: its working folder (a writable copy of the scripts version that every attempt of the run
shares) and its output, checkpoint and log folders, under the run's results folder.

The orchestrator makes them before the launch where it can reach the results folder (the process and docker pools:
infra/engines/script.py). On Azure ML the results folder is the job's output, which exists only on the nodes: there
the first rank of each node makes them (`prepare_once`, called by rank.py when TRAINFLOW_PREPARE_FROM names the
scripts version), under a node-wide lock that the node's other ranks wait on, once per attempt (PREPARED).

The standard library only, with nodelib's scripts check: it runs on the nodes (rank.py puts nodelib on the path).
"""

import fcntl
import shutil
import tempfile
from pathlib import Path

from nodelib.scripts import HASHES, expected_version, version_files, version_problem

WORK, OUTPUTS, CHECKPOINTS, LOGS = "work", "outputs", "checkpoints", "logs"  # the run folder's parts for a script
FOLDERS = {"output": OUTPUTS, "checkpoints": CHECKPOINTS, "logs": LOGS}  # placeholder -> its part
PREPARED = ".trainflow-prepared"  # in the results folder: the run and attempt whose folders were made last


def copy_version(version: Path, work: Path) -> None:
    """The scripts version's files over `work`, each replaced whole (a file the script wrote there stays)."""
    for rel in version_files(version):
        target = work / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(version / rel, target)


def make_folders(version: Path, out: Path) -> None:
    """The working folder (the version copied over it) and the output, checkpoint and log folders under `out`."""
    copy_version(version, out / WORK)
    for part in FOLDERS.values():
        (out / part).mkdir(parents=True, exist_ok=True)


def prepare_once(version: Path, out: Path, key: str) -> str | None:
    """Make the run's folders under `out` unless a rank did for `key` (the run and its attempt: PREPARED says which
    did last); what keeps the version from being run (nodelib/scripts.py), or None. The other ranks of the node wait
    on a node-wide lock. Nodes of one job each copy the same bytes, so it does not matter which writes a file last."""
    expected = expected_version(version)
    if expected is None:
        return f"{version} is not a scripts version (it has no {HASHES})"
    done = out / PREPARED
    with open(Path(tempfile.gettempdir()) / "trainflow-prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file() and done.read_text() == key:
            return None
        if problem := version_problem(version, expected):
            return problem
        make_folders(version, out)
        done.write_text(key)
    return None
