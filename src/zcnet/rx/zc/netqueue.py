"""Which NIC queue carries a socket's flow: SO_INCOMING_NAPI_ID, then the netdev family's NAPI
and queue listings (zcrx and devmem take over that queue)."""

from __future__ import annotations

import os
import socket

from zcnet.errors import Unsupported
from zcnet.nic import genl, netdev
from zcnet.uapi import netdev as nd
from zcnet.uapi import socket as usock


def find_queue(fd: int) -> tuple[str, int]:
    """(ifname, rx queue) that delivered this socket's packets, from SO_INCOMING_NAPI_ID and the
    netdev family's NAPI and queue listings."""
    napi_id = incoming_napi_id(fd)
    if not napi_id:
        raise Unsupported("the socket has no NAPI id (loopback, or no packet received yet), so "
                          "its NIC queue is unknown", "pass ifname and queue")
    with genl.GenlSocket() as g:
        return queue_of_napi(g, napi_id)


def incoming_napi_id(fd: int) -> int:
    sk = socket.socket(fileno=os.dup(fd))
    try:
        return int(sk.getsockopt(usock.SOL_SOCKET, usock.SO_INCOMING_NAPI_ID))
    finally:
        sk.close()


def queue_of_napi(g: genl.GenlSocket, napi_id: int) -> tuple[str, int]:
    """(ifname, rx queue) served by NAPI ``napi_id``, asked over the netdev family (``g``: a
    GenlSocket). A NAPI also serves TX queues, often with other ids: only RX counts."""
    napi = g.do(netdev.FAMILY, nd.NETDEV_CMD_NAPI_GET, netdev.NAPI, {"id": napi_id},
                what=f"NAPI {napi_id}") or {}
    ifindex = int(napi.get("ifindex", 0))
    rows = g.dump(netdev.FAMILY, nd.NETDEV_CMD_QUEUE_GET, netdev.QUEUE, {"ifindex": ifindex},
                  what="queues")
    ifname = socket.if_indextoname(ifindex)
    for q in rows:
        if q.get("napi-id") == napi_id and q.get("type") == nd.NETDEV_QUEUE_TYPE_RX:
            return ifname, int(q["id"])
    raise Unsupported(f"no rx queue of {ifname} is served by NAPI {napi_id}",
                      "pass the queue explicitly")
