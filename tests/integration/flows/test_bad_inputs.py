"""Every bad input of tests/fakes/bad_inputs.py, run for real: one `error:` line, its exit status, no traceback,
nothing heavy started, and the table of bad inputs in docs/reference/errors.md is exactly what trainflow answers."""

import pytest

from tests.fakes.bad_inputs import CASES, ERRORS_PAGE, page_table, run_all, table

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


def test_the_table_of_the_errors_page_is_what_trainflow_says(outcomes):
    assert page_table(ERRORS_PAGE.read_text()) == table(outcomes), (
        "the table of bad inputs in docs/reference/errors.md is out of date: regenerate it with "
        "`.venv/bin/python -m tests.fakes.bad_inputs`"
    )
