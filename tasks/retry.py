"""When Prefect should retry a step: transient failures yes, bad input and refused credentials no."""

from infra.blobstore import StorageError
from infra.fileserver import FileServerError
from infra.images import ImageError
from infra.launcher import BadInput
from infra.pools import PoolError


def is_permanent(exc: BaseException) -> bool:
    """Errors that the same attempt would meet again (a full disk stays full)."""
    return isinstance(exc, (BadInput, FileServerError)) or (isinstance(exc, (StorageError, ImageError, PoolError)) and exc.permanent)


def unless_permanent(task, task_run, state) -> bool:
    """Prefect retry_condition_fn: retry unless the failure is permanent."""
    outcome = state.result(raise_on_failure=False)
    return not (isinstance(outcome, BaseException) and is_permanent(outcome))
