"""rtnetlink inside a named namespace, with kernel errors turned into errors a user can act on."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from zcnet.errors import ZcnetError
from zcnet.netns import NeedRoot, can_create_netns, in_netns, privilege_hint

# errno -> the fix to suggest; the kernel's own message is kept in the error text.
_HINTS = {
    errno.EOPNOTSUPP: "the kernel lacks veth or network namespaces (modprobe veth)",
    errno.ENOENT: "a lab namespace vanished; `zcnet lab status` shows what is left",
    errno.EINVAL: "the kernel rejected the value; check MTU and names",
    errno.EEXIST: "a leftover lab collides; `zcnet lab down` sweeps stale labs",
}

def translate(exc: OSError | NetlinkError, what: str) -> ZcnetError:
    """One ZcnetError for a failed lab step, keeping errno and the kernel's message."""
    code = exc.code if isinstance(exc, NetlinkError) else exc.errno
    if code in (errno.EPERM, errno.EACCES) and not can_create_netns():
        return NeedRoot()
    text = os.strerror(code) if code else str(exc)
    detail = getattr(exc, "msg", None) if isinstance(exc, NetlinkError) else None
    if detail and detail != text:
        text = f"{text}: {detail}"
    hint = privilege_hint() if code in (errno.EPERM, errno.EACCES) else _HINTS.get(code or 0)
    return ZcnetError(f"{what} failed: {text}", hint)


@contextmanager
def rtnl(ns: str) -> Iterator[IPRoute]:
    """An IPRoute whose netlink socket was opened inside namespace NS (no helper process)."""
    with in_netns(ns):
        ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


def ifindex(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise ZcnetError(f"interface {ifname} is missing",
                         "`zcnet lab status` shows what is left")
    return int(found[0])
