"""The receive core's optional compiled twins (zcnet.rx.zc._rxaccel; setup.py builds it when a
compiler exists), by backend: the receive path's modules ask here, as the ring's ask
zcnet.uring.syscall."""

from __future__ import annotations

import importlib
from types import ModuleType

_rxaccel: ModuleType | None
try:
    # By name: an extension module has no source, so the import graph (grimp) would see
    # ``from zcnet.rx.zc import _rxaccel`` as an import of the package itself, a cycle through
    # rx/zc/__init__ that is not there.
    _rxaccel = importlib.import_module("zcnet.rx.zc._rxaccel")
except ImportError:  # not built: the pure path runs
    _rxaccel = None


def rx_accel_for(kind: str) -> ModuleType | None:
    """The compiled twins when backend ``kind`` (zcnet.uring.syscall.backend) is "c", else
    None."""
    return _rxaccel if kind == "c" else None
