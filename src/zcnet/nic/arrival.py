"""Which RX queue a connection arrived on, and whether it is one of the queues ``nic setup``
steered its port to.

Some facts about finding a connection's queue:
- The kernel records, per socket, the NAPI instance that last delivered one of its packets
  (SO_INCOMING_NAPI_ID). It is 0 until a packet arrives through a NAPI (never on loopback,
  and not for a connection that has received nothing yet, a SYN aside).
- NAPI ids are the kernel's own; the netdev family maps one to its device (NAPI_GET, which
  answers only in the device's namespace) and to the RX queue it serves (QUEUE_GET). A NAPI
  may serve TX queues too, often listed with other ids: only the RX queue counts.
- A flow rule sends a port to one queue, an RSS context spreads it over several by hash; a
  rule that matches first, RSS, or a setup that was restored sends it elsewhere. Such a
  connection's payload never reaches the zero-copy memory of the set-up queues, so the
  error says where it went, which queues it should have reached, and what would fix it.
"""

from __future__ import annotations

import os
import socket

from zcnet.errors import Unsupported, ZcnetError
from zcnet.netns import in_netns
from zcnet.nic import netdev
from zcnet.nic.device import Device
from zcnet.nic.genl import GenlSocket
from zcnet.nic.setup import NicConfig, iface_args
from zcnet.nic.steps import queues_text
from zcnet.uapi import netdev as nd
from zcnet.uapi import socket as usock


def incoming_napi_id(fd: int) -> int:
    """SO_INCOMING_NAPI_ID of socket ``fd`` (0: no packet came through a NAPI yet)."""
    with socket.socket(fileno=os.dup(fd)) as sk:
        return int(sk.getsockopt(usock.SOL_SOCKET, usock.SO_INCOMING_NAPI_ID))


def queue_of_napi(g: GenlSocket, napi_id: int, netns: str | None = None) -> tuple[str, int]:
    """(ifname, rx queue) served by NAPI ``napi_id``, asked over the netdev family (``g``, a
    socket in ``netns``, where the device is named). A NAPI also serves TX queues, often
    with other ids: only RX counts."""
    napi = g.do(netdev.FAMILY, nd.NETDEV_CMD_NAPI_GET, netdev.NAPI, {"id": napi_id},
                what=f"NAPI {napi_id}") or {}
    ifindex = int(napi.get("ifindex", 0))
    rows = g.dump(netdev.FAMILY, nd.NETDEV_CMD_QUEUE_GET, netdev.QUEUE, {"ifindex": ifindex},
                  what="queues")
    with in_netns(netns):
        ifname = socket.if_indextoname(ifindex)
    for q in rows:
        if q.get("napi-id") == napi_id and q.get("type") == nd.NETDEV_QUEUE_TYPE_RX:
            return ifname, int(q["id"])
    raise Unsupported(f"no rx queue of {ifname} is served by NAPI {napi_id}",
                      "pass the queue explicitly")


class WrongQueue(ZcnetError):
    """A connection arrived outside the set-up queues: ``ifname`` and ``queue`` say where
    (None when the NAPI that delivered it is no RX queue of the set-up device's namespace)."""

    def __init__(self, message: str, hint: str, ifname: str | None, queue: int | None) -> None:
        super().__init__(message, hint)
        self.ifname, self.queue = ifname, queue


def arrived_on(conn: socket.socket | int, cfg: NicConfig) -> int:
    """Which of ``cfg.queues`` (on ``cfg.ifname``) delivered connection ``conn``: its
    SO_INCOMING_NAPI_ID, looked up in the netdev family. ``WrongQueue`` when it came through
    another queue or device; ``Unsupported`` before any packet came through a NAPI."""
    fd = conn if isinstance(conn, int) else conn.fileno()
    who, port = _ends(fd)
    napi_id = incoming_napi_id(fd)
    if not napi_id:
        raise Unsupported(f"connection {who} has no NAPI id (nothing received through a NIC "
                          "queue yet, or loopback), so its queue is unknown",
                          "ask once its first bytes have arrived")
    with Device.open(cfg.ifname, cfg.netns) as dev:
        try:
            ifname, queue = queue_of_napi(dev.genl, napi_id, cfg.netns)
        except (ZcnetError, OSError):   # another namespace's NAPI, or a TX-only one
            ifname, queue = None, None
    if ifname == cfg.ifname and queue is not None and queue in cfg.queues:
        return queue
    target = f"{cfg.ifname} {queues_text(cfg.queues)}"
    if ifname is None:
        where = f"through NAPI {napi_id}, which serves no RX queue of {cfg.ifname}'s namespace"
    else:
        where = f"on {ifname} queue {queue}"
    why = f"connection {who} arrived {where}, not on the {cfg.mode} {target}"
    iface, queues = iface_args(cfg.ifname, cfg.netns), ",".join(map(str, cfg.queues))
    if ifname is not None and ifname != cfg.ifname:
        fix = f"connect to an address of {cfg.ifname} (the route took {ifname})"
    elif port in cfg.ports:
        fix = (f"port {port} is set up for {target}, yet another flow rule or RSS took it: "
               f"check with `zcnet nic show {iface}` and `zcnet nic doctor {iface} "
               f"--queues {queues}`")
    else:
        fix = (f"steer port {port} to {queues_text(cfg.queues)} with `{_setup_command(cfg, port)}` "
               f"(after `zcnet nic restore {iface}`), or connect to port "
               f"{','.join(map(str, cfg.ports))}")
    raise WrongQueue(why, fix, ifname, queue)


def _ends(fd: int) -> tuple[str, int]:
    """("from 198.18.0.1:40000 to port 9999", 9999) for connection ``fd``."""
    with socket.socket(fileno=os.dup(fd)) as sk:
        port = int(sk.getsockname()[1])
        try:
            peer = sk.getpeername()
        except OSError:   # no longer connected
            return f"on port {port}", port
    host = f"[{peer[0]}]" if ":" in peer[0] else peer[0]
    return f"from {host}:{peer[1]} to port {port}", port


def _setup_command(cfg: NicConfig, port: int) -> str:
    ports = ",".join(map(str, (*cfg.ports, port)))
    queues = ",".join(map(str, cfg.queues))
    option = "--queue" if len(cfg.queues) == 1 else "--queues"
    context = " --rss-context" if cfg.rss_context else ""
    return (f"zcnet nic setup {iface_args(cfg.ifname, cfg.netns)} {option} {queues} "
            f"--port {ports}{context}")
