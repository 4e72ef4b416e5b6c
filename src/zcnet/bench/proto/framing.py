"""Frames on the wire: a 4-byte big-endian payload length, then that many bytes of UTF-8 JSON
holding one object with a ``"type"`` key. A frame that announces more than the allowed size is
refused before any of it is buffered."""

from __future__ import annotations

import json
import struct
from enum import Enum
from typing import NoReturn

from zcnet.bench.proto.errors import LocalProtocolError, RemoteProtocolError
from zcnet.bench.proto.schema import MAX_MESSAGE, Message, validate

HEADER = struct.Struct("!I")


class NeedData(Enum):
    NEED_DATA = "need_data"


NEED_DATA = NeedData.NEED_DATA


def encode(msg: Message) -> bytes:
    payload = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
    if len(payload) > MAX_MESSAGE:
        raise LocalProtocolError("too_big", f"{msg.get('type')}: {len(payload)} bytes")
    return HEADER.pack(len(payload)) + payload


class Decoder:
    """Reassembles frames from a byte stream; yields validated messages."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def pending(self) -> int:
        return len(self._buf)

    def next(self, max_message: int = MAX_MESSAGE) -> Message | NeedData:
        if len(self._buf) < HEADER.size:
            return NEED_DATA
        (length,) = HEADER.unpack_from(self._buf)
        if length > max_message:
            raise RemoteProtocolError("too_big", f"frame of {length} bytes > {max_message}")
        if len(self._buf) < HEADER.size + length:
            return NEED_DATA
        payload = bytes(self._buf[HEADER.size : HEADER.size + length])
        del self._buf[: HEADER.size + length]
        try:
            msg: object = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise RemoteProtocolError("malformed", f"bad JSON: {str(exc)[:80]}") from None
        return validate(msg)


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")
