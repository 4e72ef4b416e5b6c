"""The receive core's optional compiled twins (zcnet.rx.zc._rxaccel; setup.py builds it when a
compiler exists), by backend: the receive path's modules ask here, as the ring's ask
zcnet.uring.syscall."""

from __future__ import annotations

from types import ModuleType

try:
    from zcnet.rx.zc import _rxaccel
except ImportError:  # not built: the pure path runs
    _rxaccel = None  # type: ignore[assignment]


def rx_accel_for(kind: str) -> ModuleType | None:
    """The compiled twins when backend ``kind`` (zcnet.uring.syscall.backend) is "c", else
    None."""
    return _rxaccel if kind == "c" else None
