"""Which NIC queue carries a socket's flow: SO_INCOMING_NAPI_ID, then the netdev family's NAPI
and queue listings (zcrx and devmem take over that queue)."""

from __future__ import annotations

from zcnet.errors import Unsupported
from zcnet.nic import genl
from zcnet.nic.arrival import incoming_napi_id, queue_of_napi


def find_queue(fd: int) -> tuple[str, int]:
    """(ifname, rx queue) that delivered this socket's packets, from SO_INCOMING_NAPI_ID and the
    netdev family's NAPI and queue listings."""
    napi_id = incoming_napi_id(fd)
    if not napi_id:
        raise Unsupported("the socket has no NAPI id (loopback, or no packet received yet), so "
                          "its NIC queue is unknown", "pass ifname and queue")
    with genl.GenlSocket() as g:
        return queue_of_napi(g, napi_id)


__all__ = ["find_queue", "incoming_napi_id", "queue_of_napi"]
