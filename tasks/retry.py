"""When Prefect should retry a step: transient failures yes, bad input and refused credentials no."""

from infra.errors import StepError
from infra.fileserver import FileServerError
from infra.jobs import JobTimedOut
from infra.launcher import BadInput


def is_permanent(exc: BaseException) -> bool:
    """Errors that the same attempt would meet again (a full disk stays full)."""
    return isinstance(exc, (BadInput, FileServerError, JobTimedOut)) or (isinstance(exc, StepError) and exc.permanent)


def unless_permanent(task, task_run, state) -> bool:
    """Prefect retry_condition_fn: retry unless the failure is permanent."""
    outcome = state.result(raise_on_failure=False)
    return not (isinstance(outcome, BaseException) and is_permanent(outcome))
