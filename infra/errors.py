"""The one base of errors that say whether retrying the same step could help."""


class StepError(Exception):
    """A step failed; `permanent` errors (bad names, refused credentials, bad input) are not worth a retry."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent
