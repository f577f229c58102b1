"""The two rules of infra/core/errors.py for what the trainer's code raises in the orchestrator: its UsageError, and
UntrustedInput (what came back from storage breaks its format's rules), are bad input wherever they are met."""

import pytest
import typer

from cli.common import friendly_errors
from infra.core.errors import BadInput, TrainflowError, exit_code, is_permanent
from nodelib.errors import UntrustedInput, UsageError


@pytest.mark.parametrize("error", [UsageError("bad"), UntrustedInput("staged data set 'd' cannot be used: ...")])
def test_the_trainers_refusals_are_permanent_bad_input(error):
    assert is_permanent(error) and exit_code(error) == BadInput.exit_code == 2


def test_a_transient_failure_stays_retried_and_a_bug_keeps_its_traceback():
    assert not is_permanent(TrainflowError("the share timed out")) and exit_code(TrainflowError("x")) == 1
    assert not is_permanent(ValueError("a bug")) and exit_code(ValueError("a bug")) is None


def test_the_command_line_ends_an_untrusted_manifest_in_one_line_and_exit_2(capsys):
    @friendly_errors
    def command():
        raise UntrustedInput("staged data set 'd' cannot be used: line 2 of its manifest.jsonl names '/x'; fix it")

    with pytest.raises(typer.Exit) as ended:
        command()
    assert ended.value.exit_code == 2
    assert capsys.readouterr().err.strip() == (
        "error: staged data set 'd' cannot be used: line 2 of its manifest.jsonl names '/x'; fix it"
    )
