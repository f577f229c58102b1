"""Every bad input of tests/fakes/bad_inputs.py, run for real: one `error:` line, its exit status, no traceback,
nothing heavy started, and the README's table of bad inputs is exactly what trainflow answers."""

import pytest

from tests.fakes.bad_inputs import CASES, readme_table, run_all, table
from tests.fakes.paths import REPO

README = REPO / "README.md"
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("bad-inputs")]  # `outcomes` runs once


@pytest.fixture(scope="module")
def outcomes():
    return run_all(CASES)


def test_the_catalog_covers_at_least_forty_inputs():
    assert len(CASES) >= 40 and len({case.input for case in CASES}) == len(CASES)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case.input for case in CASES])
def test_a_bad_input_ends_in_one_line_and_its_exit_status(outcomes, index):
    case, result, line, started = outcomes[index]
    assert result.returncode == case.code, result.stderr[-2000:]
    assert started == []  # refused before Prefect, Azurite or any folder of results
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip().splitlines()[-1]], result.stderr
    assert line.startswith("error: ")


def test_the_readme_table_is_what_trainflow_says(outcomes):
    assert readme_table(README.read_text()) == table(outcomes), (
        "the README's table of bad inputs is out of date: regenerate it with "
        "`.venv/bin/python -m tests.fakes.bad_inputs`"
    )
