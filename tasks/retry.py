"""Prefect's retry condition for every step: the one retry rule of infra/core/errors.py, and none once the command
is stopping (a step that fails as its workers are stopped, or on a write to a terminal just closed, is not worth a
retry: the re-run is; infra/core/stopping.py)."""

from infra.core.errors import is_permanent
from infra.core.stopping import stopping


def unless_permanent(task, task_run, state) -> bool:
    """Prefect retry_condition_fn: retry unless the failure is permanent or the command is stopping."""
    outcome = state.result(raise_on_failure=False)
    return not (isinstance(outcome, BaseException) and is_permanent(outcome)) and not stopping()
