"""The process's effective capabilities, read from /proc/self/status.

Capabilities, not the uid, decide what the kernel allows: root in a container may lack
CAP_NET_ADMIN, and a non-root process may hold CAP_IPC_LOCK. The bits are in
``zcnet.uapi.capability``.
"""

from __future__ import annotations

import os

STATUS = "/proc/self/status"


def effective_caps() -> int | None:
    """The CapEff mask of this process, or None where /proc does not say."""
    try:
        with open(STATUS) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return None


def has_caps(cap: int, *more: int) -> bool:
    """True if this process holds every one of the given capabilities. Where /proc cannot tell,
    root is assumed to hold them and anyone else not."""
    eff = effective_caps()
    if eff is None:
        return os.geteuid() == 0
    need = 0
    for bit in (cap, *more):
        need |= 1 << bit
    return eff & need == need
