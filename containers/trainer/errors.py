"""The one error type the training engine reports as a one-line message instead of a traceback."""


class UsageError(Exception):
    """Bad input from the user: the message names what is wrong and how to fix it."""
