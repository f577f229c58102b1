"""Prefect's retry condition for every step: the one retry rule of infra/core/errors.py."""

from infra.core.errors import is_permanent


def unless_permanent(task, task_run, state) -> bool:
    """Prefect retry_condition_fn: retry unless the failure is permanent."""
    outcome = state.result(raise_on_failure=False)
    return not (isinstance(outcome, BaseException) and is_permanent(outcome))
