"""Domain errors and the exit codes shared by every command.

Library code raises a subclass of :class:`DPAuditError` for anything the user can fix (bad input,
bad file, unreachable target); the CLI turns it into one line on stderr and exit code 2.
"""

EXIT_OK = 0
EXIT_VIOLATION = 1  # an audit/check found a violation or failed its check
EXIT_USAGE = 2  # bad usage or bad input


class DPAuditError(Exception):
    """Base class for errors caused by user input; message is one line, shown as is."""


class InputError(DPAuditError, ValueError):
    """A parameter or a data file is invalid."""


class DataError(InputError):
    """A dataset could not be loaded or is unusable."""


class CheckpointError(DPAuditError):
    """A checkpoint is missing, corrupt, unsafe or does not match its spec."""


class UnsupportedEventError(DPAuditError, NotImplementedError):
    """An accountant cannot handle a (sub-)event."""


class UnreachableTargetError(InputError):
    """A calibration target (e.g. epsilon) cannot be reached with the given settings."""


class FileContentError(InputError):
    """A file the user gave has bad content: the message names the file's own fields, not a command's
    options, so the CLI prints it as it is (see ``dpaudit.cli._common``)."""
