"""Debug mode of a receive core (``debug=True``): views handed out for a chunk are revoked when
it is released and its bytes poisoned, so a use after release fails or reads obvious garbage
instead of plausible new data."""

from __future__ import annotations

import warnings
import weakref

from zcnet.rx.zc.area import Area
from zcnet.rx.zc.chunks import Chunk, Held

# Poison written over a released chunk in debug mode, so a stale numpy array reads garbage that
# is easy to recognise instead of plausible new data.
POISON = 0xDB


class DebugViews:
    """The core's debug-mode half: it tracks the views of each held chunk by id."""

    __slots__ = ()
    views: dict[int, list[object]]
    area: Area  # its ``array`` is what gets poisoned

    def track(self, held: Held, view: object) -> None:
        self.views.setdefault(id(held), []).append(view)

    def revoke(self, held: Held) -> None:
        """Debug mode: invalidate views handed out for ``held`` and poison its bytes."""
        alive = 0
        for v in self.views.pop(id(held), ()):
            if isinstance(v, weakref.ref):
                alive += v() is not None  # a numpy array cannot be revoked, only reported
                continue
            try:
                v.release()  # type: ignore[attr-defined]  # a memoryview
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
