"""The compiled loop pass reads and writes its objects' per-pass attributes in place."""

from __future__ import annotations

import inspect

from zcnet import aio
from zcnet.aio import protocol, shared
from zcnet.rx.zc.bookkeeping import Stats
from zcnet.rx.zc.core import RxCore
from zcnet.uring.bufring import BufRing
from zcnet.uring.ring import Ring


def test_what_the_compiled_pass_touches_every_time_is_a_slot() -> None:
    """The pass reads and writes these in place at their slot offsets (no dict lookup); a class
    that lost its slot would still work (the generic getattr) but pay a lookup per access."""
    touched = {
        protocol.TransportState: ("closing", "eof", "fd", "paused", "waiting_release", "wbuf"),
        aio.ZcTransport: ("protocol", "st"),
        RxCore: ("closed", "limit", "owner_tid", "phase", "stalled", "stats", "stream_off"),
        BufRing: ("head", "registered", "tail", "in_ring"),
        Stats: ("delivered", "delivered_bytes", "released", "released_bytes", "peak_in_flight",
                "peak_in_flight_bytes"),
        shared.MemberRing: ("inbox", "fast", "on_ready"),
        Ring: ("fd",),
    }
    for cls, names in touched.items():
        for name in names:
            assert type(inspect.getattr_static(cls, name)).__name__ == "member_descriptor", (
                cls, name)
