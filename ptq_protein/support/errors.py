"""Exception types the CLI turns into one-line messages and exit codes.

Library code raises these (or plain ``ValueError``/``TypeError``) for bad user
input; the CLI maps :class:`InputError` and friends to exit code 2 and any
other failure to exit code 1.
"""

__all__ = ["InputError", "MissingWeightsError", "ArtifactError", "BusyError"]


class InputError(ValueError):
    """Bad user input (a file, a sequence, an option): the message names it and the fix."""


class MissingWeightsError(InputError, FileNotFoundError):
    """A checkpoint could not be found locally; the message lists what was searched."""


class ArtifactError(InputError):
    """A saved artifact is missing files, truncated or tampered with."""


class BusyError(InputError):
    """An output folder or file is locked by another running process; the message names the holder."""
