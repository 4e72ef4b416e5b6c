"""What can go wrong in a control conversation, and whose fault it is."""

from __future__ import annotations


class ProtocolError(Exception):
    """The conversation broke a rule. ``code`` is what goes into the error message's code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RemoteProtocolError(ProtocolError):
    """The peer sent something invalid: reply with ``error`` and close."""


class LocalProtocolError(ProtocolError):
    """We tried to send something the protocol does not allow now: a bug on our side."""
