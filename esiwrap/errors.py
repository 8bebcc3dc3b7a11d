"""Exit codes and the exceptions that carry them: one shutdown path, every code a named constant."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1  # esiwrap's own failure, with a one-line reason
EXIT_USAGE = 2
EXIT_NO_DEADLINE = 3  # `esiwrap deadline`: no source answered
EXIT_NOT_RESTORED = 66  # EX_NOINPUT: not started, `--restore` could not bring the job's checkpoint back
EXIT_NOT_RUNNING = 3  # `esiwrap status`: no esiwrap is running (or none with that pid)
EXIT_NOT_UPLOADED = 74  # EX_IOERR: checkpoint complete on local storage only; its upload did not finish
EXIT_CHECKPOINTED = 75  # EX_TEMPFAIL: stopped after a completed checkpoint; resume elsewhere
EXIT_SAVE_MISSED = 76  # stopped with no acknowledged checkpoint (deadline passed, or nothing attached)
EXIT_NO_PROGRESS = 78  # EX_CONFIG: not started, the job's last runs made no progress (--max-no-progress-runs)
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


class EsiwrapError(Exception):
    """Base class: a failure with a message meant for a person."""


class UsageError(EsiwrapError):
    """Bad input from the user: one line that names the input and the fix; exit 2."""


class CommandError(EsiwrapError):
    """The command could not be started (127 not found, 126 not executable)."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class SourceUnavailable(EsiwrapError):
    """A deadline source could not answer; the reason is for a person to act on.

    `expected` marks the ordinary case of a source that does not apply here (a variable that is
    not set, not running on that cloud): logged at info level, not as a warning. `withdrawn`: what
    the source said before no longer holds (an announced event was cancelled or is over).
    """

    def __init__(self, reason: str, *, expected: bool = False, withdrawn: bool = False) -> None:
        super().__init__(reason)
        self.expected = expected
        self.withdrawn = withdrawn


class Halt(Exception):
    """Raised once inside the supervisor loop to leave it with a reason and an exit status."""

    def __init__(self, reason: str, exit_status: int, cause: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_status = exit_status
        self.cause = cause  # why the run stopped, as the controller said (`controller.StopCause`)
