"""The one hierarchy of errors trainflow reports, and its two rules.

- Retry: a step is retried unless its error is `permanent` (the same attempt would meet it again: bad
  input, refused credentials, a full disk, a job past its time limit). Other errors are transient. A full disk
  is recognised in one place (nodelib/errors.py `is_disk_full`; a writer names it as `DiskFull`).
- The trainer's `UsageError` (nodelib/errors.py), `UntrustedInput` included (what came back from storage breaks
  its format's rules), is bad input wherever the orchestrator meets it: the upload step's skip decision, the sync,
  the dry run, `runs`, `predict`; permanent, and exit 2, as `BadInput` is.
- Exit code: `BadInput` (the user must change a setting, an option or the data) exits 2; every other
  `TrainflowError`, and an Azure SDK error that reaches the command line, exits 1 with one line; anything
  else is a bug and shows its traceback, but a full disk (one no writer named is still a fault, not a bug).

Each system's errors derive from these (StorageError, ImageError, PoolError, ...), next to the system.
"""

from azure.core.exceptions import AzureError

from nodelib.errors import UsageError, is_disk_full
from nodelib.errors import first_line as first_line  # the orchestrator's too: re-exported (mypy's explicit form)


class TrainflowError(Exception):
    """A failure trainflow explains in one line; `permanent` ones are not worth a retry."""

    permanent = False
    exit_code = 1

    def __init__(self, message: str, permanent: bool | None = None):
        super().__init__(message)
        if permanent is not None:
            self.permanent = permanent


class BadInput(TrainflowError):
    """A setting, option or input that cannot be used; the message names it and the fix."""

    permanent = True
    exit_code = 2


def is_permanent(exc: BaseException) -> bool:
    """The retry rule: retry unless the error says the same attempt would meet it again."""
    return (isinstance(exc, TrainflowError) and exc.permanent) or isinstance(exc, UsageError) or is_disk_full(exc)


def exit_code(exc: BaseException) -> int | None:
    """The exit-code rule: 2 for bad input, 1 for a run that failed, None for a bug (its traceback is shown).
    AzureError is what the Azure SDKs raise past our clients (refused credentials, quota, a cluster that
    cannot be created)."""
    if isinstance(exc, TrainflowError):
        return exc.exit_code
    if isinstance(exc, UsageError):
        return BadInput.exit_code
    return 1 if isinstance(exc, AzureError) or is_disk_full(exc) else None
