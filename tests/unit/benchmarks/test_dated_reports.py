"""The committed benchmark reports (docs/benchmarks/): one dated page per measurement JSON and the index of them,
exactly what `python -m benchmarks.report` writes from the JSON, so a page cannot drift from its figures."""

import json
import shutil
import sys
from datetime import UTC, datetime

import pytest

from benchmarks.common import how_measured, write_json
from benchmarks.report import DOCS, measured, write_reports
from flows.config import ConfigError

MEASUREMENTS = sorted(DOCS.glob("*.json"))


def test_every_committed_report_is_what_its_json_gives(tmp_path):
    # written by hand, or by the suite's timeline (python -m tests.timeline), and listed by the index
    elsewhere = [*DOCS.glob("earlier-*.md"), *DOCS.glob("suite-*")]
    for path in [*MEASUREMENTS, *elsewhere]:
        shutil.copy(path, tmp_path)
    written = write_reports(tmp_path)
    kept = {path.name for path in elsewhere}
    made = sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".md", ".svg") and p.name not in kept)
    assert len(written) == len(MEASUREMENTS) + 1  # a page each, and the index
    stale = [name for name in made if (tmp_path / name).read_bytes() != (DOCS / name).read_bytes()]
    assert not stale, f"{stale} differ from what their JSON gives: run `.venv/bin/python -m benchmarks.report`"


def test_the_index_lists_every_measurement_with_its_date_newest_first():
    index = (DOCS / "index.md").read_text()
    rows = [line for line in index.splitlines() if line.startswith("| 20")]
    assert len(rows) == len(MEASUREMENTS)
    assert [row.split(" | ")[0] for row in rows] == sorted((row.split(" | ")[0] for row in rows), reverse=True)
    for path in MEASUREMENTS:
        entry = json.loads(path.read_text())["measured"]
        assert f"| {entry['date']} | [{entry['title']}]({path.stem}.md) |" in index


def test_a_measurement_that_does_not_say_when_it_was_made_is_refused(tmp_path):
    data = json.loads((DOCS / "frameworks.json").read_text())
    del data["measured"]
    (tmp_path / "frameworks.json").write_text(json.dumps(data))
    with pytest.raises(
        ConfigError, match='frameworks.json says nothing of when and how it was measured: add "measured"'
    ):
        write_reports(tmp_path)
    assert not list(tmp_path.glob("*.md"))


def test_a_bench_s_json_records_when_and_how_it_was_measured(tmp_path, monkeypatch):
    """What a bench writes with --json is what the report script reads: no hand-added "measured" entry needed."""
    out = tmp_path / "train.json"
    monkeypatch.setattr(sys, "argv", ["trainflow", "bench", "train", "--json", str(out)])
    write_json({"rows": []}, out)
    entry = measured(json.loads(out.read_text()), out)
    assert entry["bench"] == "train" and entry["command"] == f"trainflow bench train --json {out}"
    assert entry["date"] == f"{datetime.now(UTC):%Y-%m-%d}"
    assert "bench" not in how_measured(["bench", "all", "--size", "tiny"])
