"""What the kernel takes as an interface name, checked before any request carries one.

Some facts (``dev_valid_name`` in net/core/dev.c): a name is 1 to IFNAMSIZ - 1 bytes (not
characters: "é" is two), is not "." or "..", and holds no '/', ':' or byte the kernel's
``isspace`` matches, which besides ASCII whitespace is 0xa0 (so a UTF-8 no-break space is
refused too). Every other byte is allowed, control characters and non-ASCII UTF-8 included. A name
that breaks these would also break the paths built from it (a state file, /sys/class/net).
"""

from __future__ import annotations

import os

from zcnet.uapi.ethtool import IFNAMSIZ

_FORBIDDEN = frozenset(b"/: \t\n\v\f\r\xa0\0")


def ifname_problem(name: str) -> str | None:
    """Why ``name`` cannot be an interface name, or None if it can."""
    try:
        raw = os.fsencode(name)
    except UnicodeError:   # a lone surrogate that is not an escaped byte
        return "is not valid text"
    if not raw:
        return "is empty"
    if len(raw) >= IFNAMSIZ:
        return f"is {len(raw)} bytes long; the kernel takes at most {IFNAMSIZ - 1}"
    if raw in (b".", b".."):
        return "is not a name"
    if bad := sorted(_FORBIDDEN.intersection(raw)):
        return (f"holds {', '.join(repr(chr(b)) for b in bad)} ('/', ':', whitespace and NUL "
                "are not allowed)")
    return None
