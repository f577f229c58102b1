"""Where the suite's time goes: a pytest plugin that writes every test phase and every costly fixture set-up, with
its worker and its wall-clock start, one JSON line each; and the report of such a file.

    make test TEST_TIMELINE=.test-timeline.jsonl      # the Makefile passes --timeline (on by default)
    python -m tests.timeline .test-timeline.jsonl --markdown report.md --plot report.svg

The report sums the time by module and by fixture, lists the slowest tests, and says how long each pytest-xdist
worker sat idle (between its tests, and after its last one while the other still ran): the figures of
docs/benchmarks/suite-*.md. The times are read here, never asserted: a test's speed is a measurement, not a rule.

pyproject.toml loads it in every pytest process (`-p tests.timeline` in addopts: a conftest's options are not
known to pytest-xdist's workers before they parse the command line). Under pytest-xdist every worker appends to the
one file (a line is one write, opened for appending); the process that hands the tests out (the controller, or the
only process without -n) empties it when it is configured, before any worker starts.
"""

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

FIXTURE_MIN_S = 0.05  # fixture set-ups shorter than this are not written: thousands of lines, none of the time


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--timeline", metavar="PATH", help="write each test phase and costly fixture set-up as JSON lines")


class Timeline:
    """The plugin: appends one JSON line per test phase and per fixture set-up of at least FIXTURE_MIN_S."""

    def __init__(self, path: Path, worker: str) -> None:
        self.path, self.worker = path, worker

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as out:  # one write per line, appended: the workers' lines never interleave
            out.write(json.dumps({**record, "worker": self.worker}) + "\n")

    def pytest_sessionstart(self) -> None:
        self.write(dict(kind="session", at=time.time(), event="start"))

    def pytest_sessionfinish(self) -> None:
        self.write(dict(kind="session", at=time.time(), event="finish"))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if getattr(report, "node", None) is None:  # the controller also sees the workers' reports: they wrote them
            phase = dict(kind="phase", test=report.nodeid, when=report.when, start=report.start, s=report.duration)
            self.write(phase | {"outcome": report.outcome})  # passed, failed or skipped: a run cut short still says

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
        start = time.time()
        try:
            return (yield)
        finally:
            if (took := time.time() - start) >= FIXTURE_MIN_S:
                test = request.node.nodeid
                self.write(dict(kind="fixture", name=fixturedef.argname, scope=fixturedef.scope, test=test, s=took))


def pytest_configure(config: pytest.Config) -> None:
    """Register the plugin where --timeline names a file; the process that hands out the tests empties it first."""
    if not (path := config.getoption("--timeline")):
        return
    path = Path(path).resolve()
    # The worker's id as pytest-xdist gives it to its config, not PYTEST_XDIST_WORKER: a test that runs pytest
    # itself (tests/integration/fakes/) passes that variable on to its own controller.
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    if worker == "main":  # the controller or a run without -n: configured before any worker
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    config.pluginmanager.register(Timeline(path, worker), "trainflow-timeline")


# ---- the report --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    """One test's phases, as its worker ran them."""

    nodeid: str
    worker: str
    start: float
    stop: float
    setup: float
    call: float
    teardown: float

    @property
    def s(self) -> float:
        return self.setup + self.call + self.teardown

    @property
    def module(self) -> str:
        return self.nodeid.split("::", 1)[0]


def read(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The records of a timeline file's lines; a line that is not one (a run killed mid-write) is named and refused."""
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise SystemExit(f"line {number} of the timeline is not a record ({error}): rerun the suite") from None
    return records


def tests_of(records: list[dict[str, Any]]) -> list[Ran]:
    """Each test's phases joined: its start (set-up's start), stop (teardown's end) and the three durations."""
    phases: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for record in records:
        if record["kind"] == "phase":
            phases[record["test"], record["worker"]][record["when"]] = record
    tests = []
    for (nodeid, worker), by_when in phases.items():
        ends = [r["start"] + r["s"] for r in by_when.values()]
        durations = {when: by_when[when]["s"] if when in by_when else 0.0 for when in ("setup", "call", "teardown")}
        start = min(r["start"] for r in by_when.values())
        tests.append(Ran(nodeid, worker, start, max(ends), **durations))
    return sorted(tests, key=lambda t: t.start)


def by_module(tests: list[Ran]) -> list[tuple[str, int, float]]:
    """(module, tests, seconds) for each module, the longest first."""
    sums: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for test in tests:
        sums[test.module][0] += 1
        sums[test.module][1] += test.s
    return sorted(((m, n, s) for m, (n, s) in sums.items()), key=lambda row: -row[2])


def by_fixture(records: list[dict[str, Any]]) -> list[tuple[str, str, int, float, float]]:
    """(fixture, scope, set-ups, total seconds, longest) for each fixture that took FIXTURE_MIN_S or more."""
    runs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for record in records:
        if record["kind"] == "fixture":
            runs[record["name"], record["scope"]].append(record["s"])
    rows = [(name, scope, len(s), sum(s), max(s)) for (name, scope), s in runs.items()]
    return sorted(rows, key=lambda row: -row[3])


def span(records: list[dict[str, Any]], tests: list[Ran]) -> tuple[float, float]:
    """The run's first and last instant: its processes' session start and finish (the tests' where none was kept)."""
    marks = [r["at"] for r in records if r["kind"] == "session"]
    return min(marks + [t.start for t in tests]), max(marks + [t.stop for t in tests])


def idle(tests: list[Ran], start: float, end: float) -> list[tuple[str, float, float, float, float]]:
    """(worker, busy, before its first test: start-up and collection, between its tests, after its last test) over
    the run's span, for each worker that ran a test."""
    rows = []
    for worker in sorted({t.worker for t in tests}):
        mine = [t for t in tests if t.worker == worker]
        busy = sum(t.stop - t.start for t in mine)
        before, after = mine[0].start - start, end - max(t.stop for t in mine)
        rows.append((worker, busy, before, (end - start) - busy - before - after, after))
    return rows


def markdown(tests: list[Ran], records: list[dict[str, Any]], slowest: int = 30) -> str:
    """The report's tables, as markdown."""
    start, end = span(records, tests)
    total = sum(t.s for t in tests)
    out = [f"{len(tests)} tests in {end - start:.0f} s of wall clock, {total:.0f} s of test time.", ""]
    head = ["worker", "busy s", "start-up and collection s", "idle between tests s", "idle after its last s"]
    out += table(head, idle(tests, start, end), "{:.0f}")
    out += table(["module", "tests", "s"], by_module(tests)[:25], "{:.0f}")
    out += table(["fixture", "scope", "set-ups", "total s", "longest s"], by_fixture(records)[:20], "{:.1f}")
    longest = sorted(tests, key=lambda t: -t.s)[:slowest]
    rows = [(t.nodeid, t.worker, t.setup, t.call, t.teardown, t.s) for t in longest]
    out += table(["test", "worker", "setup s", "call s", "teardown s", "total s"], rows, "{:.1f}")
    return "\n".join(out)


def table(head: list[str], rows: Iterable[tuple], number: str) -> list[str]:
    """A markdown table: numbers in `number`'s format, text as is; a blank line after."""
    cells = [[number.format(c) if isinstance(c, float) else str(c) for c in row] for row in rows]
    return [f"| {' | '.join(head)} |", f"|{'---|' * len(head)}", *(f"| {' | '.join(r)} |" for r in cells), ""]


def plot(tests: list[Ran], path: Path) -> None:
    """Each worker's tests on one time line, a bar each, coloured by tier (unit, integration): where one waits."""
    from infra.core.plots import new_figure, save_svg  # here: the plugin itself loads in every pytest process

    origin = min(t.start for t in tests)
    workers = sorted({t.worker for t in tests})
    colours = {"unit": "tab:green", "integration": "tab:blue"}
    fig, [ax] = new_figure(1, 1, size=(12, 1 + 0.8 * len(workers)))
    for row, worker in enumerate(workers):
        for tier, colour in colours.items():
            bars = [(t.start - origin, t.stop - t.start) for t in tests if t.worker == worker and tier_of(t) == tier]
            ax.broken_barh(bars, (row - 0.4, 0.8), color=colour, label=tier if row == 0 else None)
    ax.set_yticks(range(len(workers)), workers)
    ax.set_xlabel("seconds since the first test started")
    ax.legend(loc="upper right")
    fig.tight_layout()
    save_svg(fig, path)


def tier_of(test: Ran) -> str:
    return "unit" if test.nodeid.startswith("tests/unit/") else "integration"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline", type=Path, help="the file `make test` wrote (--timeline)")
    parser.add_argument("--markdown", type=Path, help="write the tables here too")
    parser.add_argument("--plot", type=Path, help="draw the workers' time lines here (SVG)")
    parser.add_argument("--title", default="Where the suite's time went", help="the markdown page's heading")
    args = parser.parse_args(argv)
    if not args.timeline.is_file():
        raise SystemExit(f"{args.timeline} is not a file: run the suite with --timeline {args.timeline} first")
    records = read(args.timeline.read_text().splitlines())
    if not (tests := tests_of(records)):
        raise SystemExit(f"{args.timeline} holds no test: run the suite with --timeline {args.timeline} first")
    text = markdown(tests, records)
    print(text)
    if args.plot:
        plot(tests, args.plot)
    if args.markdown:
        picture = [f"![each worker's tests on one time line]({args.plot.name})", ""] if args.plot else []
        args.markdown.write_text("\n".join([f"# {args.title}", "", *picture, text]) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
