"""What a ``kernelflow`` command tells its caller when it cannot do what was asked: the
exceptions that end it with one line on stderr, and the exit codes.

Exit codes: 0 success; 1 the task ran but did not succeed (failed, cancelled); 2 bad
input (a task file, workflow or option that cannot be used, or a task the daemon
rejected); 3 the wait timed out (or no daemon takes a cancel yet); 130 interrupted; 141
the reader of the output went away (``| head``).
"""

from __future__ import annotations

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command killed by SIGPIPE


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class CommandFailed(Exception):
    """The command could not finish: printed as one line (why, and what to do), exit 1."""


class WaitTimeout(Exception):
    """The task did not finish within the user's --timeout: exit code 3."""


def exit_code_for(status: str) -> int:
    """The exit code of a command that waited for a task ending with ``status``."""
    return {"success": EXIT_OK, "rejected": EXIT_BAD_INPUT}.get(status, EXIT_FAILED)
