"""The one error type the CLI turns into a clear message and an exit code (never a traceback)."""

from __future__ import annotations


class HpcError(Exception):
    """Something the user can fix: what was wrong, and how to fix it.

    exit_code follows the CLI convention: 1 for a failure or invalid input found, 2 for a usage error.
    """

    def __init__(self, message: str, fix: str | None = None, exit_code: int = 1):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class UsageError(HpcError):
    """Bad command-line usage (exit 2), e.g. mutually exclusive options."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message, fix, exit_code=2)
