"""`trainflow bench script`'s pure parts: reading the script's `Total img/sec` line, the results folder and the step
table that `trainflow run` prints, the one-line edit, and the figures computed within each round."""

import io

import pytest
from rich.console import Console

from benchmarks import script
from benchmarks.report import write_report
from flows.report import step_rows
from infra.engines.launchers import LaunchError
from infra.storage.transfers import print_summary_table

MACHINE = {"cores": 2, "memory_gb": 23.4, "platform": "Linux", "python": "3.11.2", "versions": {"torch": "2.14.1"}}


def test_the_script_s_total_rate_is_read_from_its_last_total_line_whatever_prefixes_it():
    by_hand = "[0]<stdout>:Iter #0: 100.0 img/sec per CPU\n[0]<stdout>:Total img/sec on 2 CPU(s): 5941.8 +-640.7\n"
    assert script.total_rate(by_hand) == 5941.8
    logged = "[rank 0] Total img/sec on 2 CPU(s): 12.0 +-1.0\n[rank 0] Total img/sec on 2 CPU(s): 2958.4 +-173.0\n"
    assert script.total_rate(logged) == 2958.4
    with pytest.raises(LaunchError, match="printed no `Total img/sec"):
        script.total_rate("[rank 0] Iter #0: 1600.0 img/sec per CPU\n")


def test_the_results_folder_is_the_results_line_not_the_file_share_s():
    out = "train.py on 2 workers: loss 2.3, 11 s\nresults: /tmp/w/runs/ec28\nresults on the file share: /x/r\n"
    assert str(script.results_folder(out)) == "/tmp/w/runs/ec28"
    with pytest.raises(LaunchError, match="no `results: PATH` line"):
        script.results_folder("results on the file share: /x/r\n")


def printed_table(done: list[dict], width: int) -> str:
    """The step table as `trainflow run` prints it, on a terminal `width` columns wide."""
    console = Console(file=io.StringIO(), width=width)
    print_summary_table(step_rows(done, {"upload-scripts": 0.01, "start-tracking": 3.1}), console, "what each step did")
    return console.file.getvalue()


DONE = [
    {"step": "build-image", "did": "skipped", "why": "nothing runs in an image on the process pool"},
    {"step": "upload-scripts", "did": "ran", "why": "upload 3 files as version 4c5fd2fe", "files": 1, "MB": 0.0},
]


def test_a_step_s_row_is_read_from_the_printed_table_by_its_column_names():
    row = script.step_row(printed_table(DONE, 400), "upload-scripts")
    assert row == {
        "step": "upload-scripts",
        "did": "ran",
        "why": "upload 3 files as version 4c5fd2fe",
        "files": "1",
        "MB": "0.0",
        "seconds": "0.0",
    }
    assert script.files_uploaded(row) == 1
    assert script.files_uploaded({"did": "skipped", "files": "0"}) == 0
    with pytest.raises(LaunchError, match="no row create-pool"):
        script.step_row(printed_table(DONE, 400), "create-pool")


def test_a_table_wrapped_by_a_narrow_terminal_is_refused_rather_than_misread():
    with pytest.raises(LaunchError, match="is COLUMNS wide enough"):
        script.step_row(printed_table(DONE, 40), "upload-scripts")


def test_the_edit_changes_exactly_one_line_of_the_example():
    text = script.EXAMPLE.joinpath(script.ENTRY).read_text()
    changed = script.edited(text)
    before, after = text.splitlines(), changed.splitlines()
    assert len(before) == len(after) and changed.endswith("\n")
    assert [i for i, (a, b) in enumerate(zip(before, after)) if a != b] == [len(before) - 1]
    compile(changed, "train.py", "exec")  # still a script that runs
    assert script.edited("a = 1\n\n\n") == f"a = 1{script.EDIT_MARK}\n\n\n"


def run(seconds: float, rate: float, training: float, run_id: str, did: str = "skipped", files: int = 0) -> dict:
    """One `trainflow run --script` as flow_run gives it."""
    upload = {"step": "upload-scripts", "did": did, "why": "", "files": str(files), "MB": "0.0", "seconds": "0.0"}
    steps = {"upload-scripts": 0.01, "start-tracking": 3.0, "run-training": training}
    named = dict(seconds=seconds, images_per_sec=rate, run_id=run_id, training_seconds=training)
    return {**named, "steps": steps, "upload": upload}


def rounds() -> list[dict]:
    return [
        {"by hand": {"seconds": 10.0, "images_per_sec": 1000.0}, "trainflow": run(22.0, 990.0, 11.0, "b")},
        {"by hand": {"seconds": 12.0, "images_per_sec": 800.0}, "trainflow": run(26.0, 760.0, 13.0, "c")},
        {"by hand": {"seconds": 11.0, "images_per_sec": 900.0}, "trainflow": run(22.0, 900.0, 12.0, "d")},
    ]


def summary(edited_id: str = "e") -> dict:
    first, edited = run(30.0, 950.0, 12.0, "a", "ran", 3), run(23.0, 900.0, 11.0, edited_id, "ran", 1)
    return script.summarise(rounds(), first, edited, {"entry": "train.py", "args": ["--iterations", "3"]})


def test_the_ratio_and_the_overhead_are_computed_within_each_round():
    """The ratio of each round's two rates (not the ratio of the medians, 900 / 900), the overhead each round's
    difference of wall seconds (the medians' difference would be 22 - 11)."""
    result = summary()
    assert result["throughput_ratio"]["all"] == pytest.approx([0.99, 0.95, 1.0])
    assert result["throughput_ratio"]["median"] == pytest.approx(0.99)
    assert result["images_per_sec"]["by hand"]["median"] == 900.0
    assert result["overhead_seconds"]["all"] == pytest.approx([12.0, 14.0, 11.0])
    assert result["overhead_seconds"]["median"] == pytest.approx(12.0)
    assert (result["overhead_seconds"]["min"], result["overhead_seconds"]["max"]) == (11.0, 14.0)
    assert result["outside_training_seconds"]["all"] == pytest.approx([11.0, 13.0, 10.0])
    assert result["seconds"]["its run-training step"]["median"] == 12.0
    assert result["step_seconds"]["start-tracking"]["median"] == 3.0
    assert result["outside_steps_seconds"]["all"] == pytest.approx([7.99, 9.99, 6.99])


def test_the_uploads_are_what_the_step_tables_said_and_every_run_is_a_new_one():
    result = summary()
    assert result["files_uploaded_after_edit"] == 1
    assert [row["did"] for row in result["uploads"]["unchanged runs"]] == ["skipped"] * 3
    assert result["new_run_each_time"]
    assert not summary(edited_id="d")["new_run_each_time"]  # the edited run came back as an earlier one


def test_the_report_shows_the_figures_against_their_goals(tmp_path):
    result = summary()
    result["settings"] |= {"workers": 2, "launcher": "horovodrun", "files": 3}
    text = write_report({"script": result}, tmp_path / "script.md", "trainflow bench script", MACHINE).read_text()
    assert "| trainflow run --script | 900 (760–990) |" in text
    assert "within each round: 0.990 (0.950–1.000) (goal ≥ 0.97)" in text
    assert "the by-hand launch's: 12.0 (11.0–14.0) s (goal ≤ 15 s)" in text
    assert "skipped in 3 of 3; a new run each time: yes" in text
    assert "(3 files in the folder): 1 file(s) uploaded (goal 1)" in text
    assert (tmp_path / "script-script.svg").exists()
