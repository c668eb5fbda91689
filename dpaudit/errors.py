"""Domain errors and the exit codes shared by every command.

Library code raises a subclass of :class:`DPAuditError` for anything the user can fix (bad input,
bad file, unreachable target); the CLI turns it into one line on stderr and exit code 2.
"""

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


class OutputError(DPAuditError):
    """An output cannot be written: permission denied, read-only file system, disk full, a parent that
    is a file. The message names the user's path."""


class OutputBusyError(InputError):
    """Another dpaudit process is writing the same output (it holds the output's lock)."""


class UnsupportedEventError(DPAuditError, NotImplementedError):
    """An accountant cannot handle a (sub-)event."""


class BudgetError(InputError):
    """Work refused by its cost estimate (:func:`dpaudit.budget.check_cost`): more memory than the machine
    has, or more time than allowed without ``--yes``. The inputs are valid; the work is too large here."""


class UnreachableTargetError(InputError):
    """A calibration target (e.g. epsilon) cannot be reached with the given settings."""


class IntegrityWarning(UserWarning):
    """A stored file did not match the hash written with it (or a claim its recorded mechanism); the
    value was recomputed or the mismatch is reported beside the result."""


class FileContentError(InputError):
    """A file the user gave has bad content: the message names the file's own fields, not a command's
    options, so the CLI prints it as it is (see ``dpaudit.cli._common``)."""
