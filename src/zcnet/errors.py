"""Errors a user can act on.

Library code raises these with a message that names the problem and a hint that names the fix;
the CLI prints both on one or two lines and exits non-zero, never with a traceback.
"""

from __future__ import annotations

import os


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


class ClosedError(ZcnetError, ValueError):
    """An object used after its ``close()``: a ValueError, like io's "I/O operation on closed
    file". ``close()`` itself stays callable (it is idempotent), and so do the read-outs an
    object documents as valid after close (a sender's ``stats()``)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint or "it cannot be used after close(); open a new one")

    @classmethod
    def of(cls, obj: object, method: str) -> ClosedError:
        """The error for ``obj.method()`` called after ``obj.close()``."""
        return cls(f"{method}() on a closed {type(obj).__name__}")


def cap_hint(cap: str) -> str:
    """The fix for a refusal that needs ``cap``. Said to root, "run as root" is false: root that
    is refused lacks the capability (a container, a dropped bounding set)."""
    return f"run as root (needs {cap})" if os.geteuid() else f"this root lacks {cap}: grant it"


def require_int(name: str, value: object, fix: str) -> None:
    """A UsageError unless ``value`` is an int (bool is not): for the sizes and ids an API takes
    whose range is the caller's own to check."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"{name} must be an int, got {type(value).__name__} {value!r}", fix)
