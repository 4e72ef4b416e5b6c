"""Debug mode of a Receiver (``debug=True``): views handed out for a chunk are revoked when it is
released and its bytes poisoned, so a use after release fails or reads obvious garbage instead
of plausible new data."""

from __future__ import annotations

import warnings
import weakref
from typing import Any

from zcnet.rx.zc.area import Area
from zcnet.rx.zc.chunks import Chunk, _Held

# Poison written over a released chunk in debug mode, so a stale numpy array reads garbage that
# is easy to recognise instead of plausible new data.
POISON = 0xDB


class DebugViews:
    """The Receiver's debug-mode half: it tracks the views of each held chunk by id."""

    _debug_views: dict[int, list[Any]]
    area: Area  # the Receiver's area: its ``array`` is what gets poisoned

    def _track(self, held: _Held, view: Any) -> None:
        self._debug_views.setdefault(id(held), []).append(view)

    def _revoke(self, held: _Held) -> None:
        """Debug mode: invalidate views handed out for ``held`` and poison its bytes."""
        alive = 0
        for v in self._debug_views.pop(id(held), ()):
            if isinstance(v, weakref.ref):
                alive += v() is not None  # a numpy array cannot be revoked, only reported
                continue
            try:
                v.release()
            except BufferError:
                alive += 1  # something still exports it
        spans = ([(held.offset, held.length)] if isinstance(held, Chunk)
                 else zip(held.offsets, held.lengths, strict=True))  # type: ignore[attr-defined]
        for off, n in spans:
            if off >= 0:
                self.area.array[off:off + n] = POISON
        if alive:
            warnings.warn(f"{held!r} released while {alive} array(s)/view(s) over it are alive; "
                          f"they now read poison bytes ({POISON:#x}) and later reused data",
                          ResourceWarning, stacklevel=4)
