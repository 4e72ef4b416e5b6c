"""Errors a user can act on.

Library code raises these with a message that names the problem and a hint that names the fix;
the CLI prints both on one or two lines and exits non-zero, never with a traceback.
"""

from __future__ import annotations


class ZcnetError(Exception):
    """A failure the user can do something about."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (fix: {self.hint})"


class UsageError(ZcnetError):
    """Bad command-line or API input."""

    exit_code = 2


class Unsupported(ZcnetError):
    """The kernel or device cannot do what was asked; carries the reason."""


class ClosedError(ValueError):
    """An object was used after its ``close()``: the resources it stood for are gone.

    A ValueError, like the error of a closed Python file, so code that catches that still works.
    """
