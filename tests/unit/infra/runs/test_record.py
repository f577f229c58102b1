"""Run records: stale runs marked interrupted, a re-run with the same inputs resumes the unfinished one
(the leash that stops a service: tests/unit/infra/services/test_supervise.py)."""

import json
import socket
import subprocess
import sys

import pytest

from infra.runs.record import fingerprint, not_resumed, read_record, tracked_run, write_record


def test_a_run_records_how_it_ended(tmp_path):
    with tracked_run(tmp_path, "a", "f1") as (run_id, resumed):
        assert (run_id, resumed) == ("a", False)
        assert read_record(tmp_path / "a")["status"] == "running"
    assert read_record(tmp_path / "a")["status"] == "complete"
    with pytest.raises(KeyboardInterrupt), tracked_run(tmp_path, "b", "f2"):
        raise KeyboardInterrupt
    with pytest.raises(ValueError), tracked_run(tmp_path, "c", "f3"):
        raise ValueError("boom")
    assert [read_record(tmp_path / r)["status"] for r in "bc"] == ["interrupted", "failed"]


def test_a_rerun_with_the_same_inputs_resumes_the_unfinished_run_and_only_that(tmp_path):
    with pytest.raises(KeyboardInterrupt), tracked_run(tmp_path, "first", "same"):
        raise KeyboardInterrupt
    with tracked_run(tmp_path, "other", "different") as (run_id, resumed):
        assert (run_id, resumed) == ("other", False)
    with tracked_run(tmp_path, "second", "same") as (run_id, resumed):
        assert (run_id, resumed) == ("first", True)
    with tracked_run(tmp_path, "third", "same") as (run_id, resumed):  # "first" is complete now: a new run
        assert (run_id, resumed) == ("third", False)
    assert read_record(tmp_path / "first")["flow_runs"] == ["first", "second"]  # the ledger counts both
    assert read_record(tmp_path / "third")["flow_runs"] == ["third"]


def dead_owner() -> str:
    """The owner label of a process of this host that has ended."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return f"{socket.gethostname()}:{dead.stdout.strip()}"


def test_a_run_whose_owner_died_is_marked_interrupted_with_its_metrics_and_resumed(tmp_path):
    write_record(
        tmp_path / "killed", {"run_id": "killed", "fingerprint": "same", "status": "running", "owner": dead_owner()}
    )
    (tmp_path / "killed" / "metrics.json").write_text(json.dumps({"status": "running", "model": "m"}))
    with tracked_run(tmp_path, "new", "same") as (run_id, resumed):
        assert (run_id, resumed) == ("killed", True)
    assert not (tmp_path / "new").exists()


def test_stale_runs_of_other_inputs_are_marked_interrupted(tmp_path):
    write_record(tmp_path / "old", {"run_id": "old", "fingerprint": "x", "status": "running", "owner": dead_owner()})
    (tmp_path / "old" / "metrics.json").write_text(json.dumps({"status": "running"}))
    with tracked_run(tmp_path, "new", "y"):
        pass
    assert read_record(tmp_path / "old")["status"] == "interrupted"
    assert json.loads((tmp_path / "old" / "metrics.json").read_text())["status"] == "interrupted"


def test_the_fingerprint_changes_with_any_input():
    assert fingerprint({"a": 1}, "v1") == fingerprint({"a": 1}, "v1")
    assert len({fingerprint({"a": 1}, "v1"), fingerprint({"a": 2}, "v1"), fingerprint({"a": 1}, "v2")}) == 3


def test_a_re_run_that_cannot_resume_says_which_settings_changed_from_what_to_what(tmp_path):
    before = {"training": {"epochs": 8, "model": "resnet18"}, "dataset": "digits", "scripts version": "v1"}
    with pytest.raises(KeyboardInterrupt), tracked_run(tmp_path, "first", "f1", before):
        raise KeyboardInterrupt
    after = {**before, "training": {"epochs": 10, "model": "resnet18"}}
    assert not_resumed(tmp_path, "f2", after) == (
        "not resuming the interrupted run first: training.epochs from 8 to 10 changed; this is a new run (set them "
        "back to resume it)"
    )
    assert not_resumed(tmp_path, "f1", before) is None  # the same inputs: it resumes
    assert read_record(tmp_path / "first")["inputs"] == before
    said: list[str] = []
    write_record(tmp_path / "first", {**read_record(tmp_path / "first"), "status": "running", "owner": dead_owner()})
    with tracked_run(tmp_path, "second", "f2", after, said.append) as (run_id, resumed):  # after a SIGKILL
        assert (run_id, resumed) == ("second", False)
    assert said == [
        "not resuming the interrupted run first: training.epochs from 8 to 10 changed; this is a new run (set them "
        "back to resume it)"
    ]
