"""The netdev generic netlink family: devices, queues, NAPI instances, page pools and their
stats, per-queue stats, and binding a dma-buf to RX queues or to a device's TX (devmem TCP).
Tables follow netdev.yaml.

Some facts about bind-rx and bind-tx: the binding belongs to the netlink socket that made it;
the kernel unbinds when that socket closes. So both return a ``DmabufBinding`` that owns its own
socket, and the caller keeps it open for as long as the queues should receive into the dma-buf
(rx) or sockets send from it (tx; skbs still in flight hold the binding in the kernel).
bind-tx takes the device's ifindex and the dma-buf fd, no queues, and answers the binding id
that SCM_DEVMEM_DMABUF names. Both check the device (queue ops, netmem TX, DMA) before they look
at the fd, so fd -1 (``NO_FD``) asks whether a device would take a binding without making one.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from contextlib import ExitStack

from zcnet.errors import Unsupported, UsageError
from zcnet.nic.device import Device
from zcnet.nic.genl import GenlSocket, NetlinkError
from zcnet.nic.nlattr import NlAttrs, T, attrset
from zcnet.uapi import netdev as n

FAMILY = n.NETDEV_FAMILY_NAME

QUEUE_TYPE = {n.NETDEV_QUEUE_TYPE_RX: "rx", n.NETDEV_QUEUE_TYPE_TX: "tx"}
QUEUE_TYPE_VALUE = {v: k for k, v in QUEUE_TYPE.items()}

DEV = attrset(
    "dev",
    (n.NETDEV_A_DEV_IFINDEX, "ifindex", T.U32),
    (n.NETDEV_A_DEV_XDP_FEATURES, "xdp-features", T.U64),
    (n.NETDEV_A_DEV_XDP_ZC_MAX_SEGS, "xdp-zc-max-segs", T.U32),
    (n.NETDEV_A_DEV_XDP_RX_METADATA_FEATURES, "xdp-rx-metadata-features", T.U64),
    (n.NETDEV_A_DEV_XSK_FEATURES, "xsk-features", T.U64),
)
IO_URING_INFO = attrset("io-uring-provider-info",
                        (n.NETDEV_A_IO_URING_PROVIDER_INFO_RX_BUF_LEN, "rx-buf-len", T.UINT))
XSK_INFO = attrset("xsk-info")  # no attributes yet: presence says AF_XDP holds the queue
PAGE_POOL = attrset(
    "page-pool",
    (n.NETDEV_A_PAGE_POOL_ID, "id", T.UINT),
    (n.NETDEV_A_PAGE_POOL_IFINDEX, "ifindex", T.U32),
    (n.NETDEV_A_PAGE_POOL_NAPI_ID, "napi-id", T.UINT),
    (n.NETDEV_A_PAGE_POOL_INFLIGHT, "inflight", T.UINT),
    (n.NETDEV_A_PAGE_POOL_INFLIGHT_MEM, "inflight-mem", T.UINT),
    (n.NETDEV_A_PAGE_POOL_DETACH_TIME, "detach-time", T.UINT),
    (n.NETDEV_A_PAGE_POOL_DMABUF, "dmabuf", T.U32),
    (n.NETDEV_A_PAGE_POOL_IO_URING, "io-uring", T.NEST, IO_URING_INFO),
)
PAGE_POOL_INFO = attrset("page-pool-info", (n.NETDEV_A_PAGE_POOL_ID, "id", T.UINT),
                         (n.NETDEV_A_PAGE_POOL_IFINDEX, "ifindex", T.U32))
PP_STAT_NAMES = ("alloc-fast", "alloc-slow", "alloc-slow-high-order", "alloc-empty",
                 "alloc-refill", "alloc-waive", "recycle-cached", "recycle-cache-full",
                 "recycle-ring", "recycle-ring-full", "recycle-released-refcnt")
PAGE_POOL_STATS = attrset(
    "page-pool-stats",
    (n.NETDEV_A_PAGE_POOL_STATS_INFO, "info", T.NEST, PAGE_POOL_INFO),
    *((n.NETDEV_A_PAGE_POOL_STATS_ALLOC_FAST + i, name, T.UINT)
      for i, name in enumerate(PP_STAT_NAMES)),
)
NAPI = attrset(
    "napi",
    (n.NETDEV_A_NAPI_IFINDEX, "ifindex", T.U32),
    (n.NETDEV_A_NAPI_ID, "id", T.U32),
    (n.NETDEV_A_NAPI_IRQ, "irq", T.U32),
    (n.NETDEV_A_NAPI_PID, "pid", T.U32),
    (n.NETDEV_A_NAPI_DEFER_HARD_IRQS, "defer-hard-irqs", T.U32),
    (n.NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT, "gro-flush-timeout", T.UINT),
    (n.NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT, "irq-suspend-timeout", T.UINT),
    (n.NETDEV_A_NAPI_THREADED, "threaded", T.U32),
)
QUEUE = attrset(
    "queue",
    (n.NETDEV_A_QUEUE_ID, "id", T.U32),
    (n.NETDEV_A_QUEUE_IFINDEX, "ifindex", T.U32),
    (n.NETDEV_A_QUEUE_TYPE, "type", T.U32),
    (n.NETDEV_A_QUEUE_NAPI_ID, "napi-id", T.U32),
    (n.NETDEV_A_QUEUE_DMABUF, "dmabuf", T.U32),
    (n.NETDEV_A_QUEUE_IO_URING, "io-uring", T.NEST, IO_URING_INFO),
    (n.NETDEV_A_QUEUE_XSK, "xsk", T.NEST, XSK_INFO),
)
QSTAT_NAMES = {
    n.NETDEV_A_QSTATS_RX_PACKETS: "rx-packets", n.NETDEV_A_QSTATS_RX_BYTES: "rx-bytes",
    n.NETDEV_A_QSTATS_TX_PACKETS: "tx-packets", n.NETDEV_A_QSTATS_TX_BYTES: "tx-bytes",
    n.NETDEV_A_QSTATS_RX_ALLOC_FAIL: "rx-alloc-fail", n.NETDEV_A_QSTATS_RX_HW_DROPS: "rx-hw-drops",
    n.NETDEV_A_QSTATS_RX_HW_DROP_OVERRUNS: "rx-hw-drop-overruns",
    n.NETDEV_A_QSTATS_RX_CSUM_COMPLETE: "rx-csum-complete",
    n.NETDEV_A_QSTATS_RX_CSUM_UNNECESSARY: "rx-csum-unnecessary",
    n.NETDEV_A_QSTATS_RX_CSUM_NONE: "rx-csum-none", n.NETDEV_A_QSTATS_RX_CSUM_BAD: "rx-csum-bad",
    n.NETDEV_A_QSTATS_RX_HW_GRO_PACKETS: "rx-hw-gro-packets",
    n.NETDEV_A_QSTATS_RX_HW_GRO_BYTES: "rx-hw-gro-bytes",
    n.NETDEV_A_QSTATS_RX_HW_GRO_WIRE_PACKETS: "rx-hw-gro-wire-packets",
    n.NETDEV_A_QSTATS_RX_HW_GRO_WIRE_BYTES: "rx-hw-gro-wire-bytes",
    n.NETDEV_A_QSTATS_RX_HW_DROP_RATELIMITS: "rx-hw-drop-ratelimits",
    n.NETDEV_A_QSTATS_TX_HW_DROPS: "tx-hw-drops",
    n.NETDEV_A_QSTATS_TX_HW_DROP_ERRORS: "tx-hw-drop-errors",
    n.NETDEV_A_QSTATS_TX_CSUM_NONE: "tx-csum-none",
    n.NETDEV_A_QSTATS_TX_NEEDS_CSUM: "tx-needs-csum",
    n.NETDEV_A_QSTATS_TX_HW_GSO_PACKETS: "tx-hw-gso-packets",
    n.NETDEV_A_QSTATS_TX_HW_GSO_BYTES: "tx-hw-gso-bytes",
    n.NETDEV_A_QSTATS_TX_HW_GSO_WIRE_PACKETS: "tx-hw-gso-wire-packets",
    n.NETDEV_A_QSTATS_TX_HW_GSO_WIRE_BYTES: "tx-hw-gso-wire-bytes",
    n.NETDEV_A_QSTATS_TX_HW_DROP_RATELIMITS: "tx-hw-drop-ratelimits",
    n.NETDEV_A_QSTATS_TX_STOP: "tx-stop", n.NETDEV_A_QSTATS_TX_WAKE: "tx-wake",
}
QSTATS = attrset(
    "qstats",
    (n.NETDEV_A_QSTATS_IFINDEX, "ifindex", T.U32),
    (n.NETDEV_A_QSTATS_QUEUE_TYPE, "queue-type", T.U32),
    (n.NETDEV_A_QSTATS_QUEUE_ID, "queue-id", T.U32),
    (n.NETDEV_A_QSTATS_SCOPE, "scope", T.UINT),
    *((aid, name, T.UINT) for aid, name in QSTAT_NAMES.items()),
)
QUEUE_ID = attrset("queue-id", (n.NETDEV_A_QUEUE_ID, "id", T.U32),
                   (n.NETDEV_A_QUEUE_TYPE, "type", T.U32))
DMABUF = attrset(
    "dmabuf",
    (n.NETDEV_A_DMABUF_IFINDEX, "ifindex", T.U32),
    (n.NETDEV_A_DMABUF_QUEUES, "queues", T.NEST, QUEUE_ID, True),
    (n.NETDEV_A_DMABUF_FD, "fd", T.U32),
    (n.NETDEV_A_DMABUF_ID, "id", T.U32),
    (n.NETDEV_A_DMABUF_RX_PAGE_SIZE, "rx-page-size", T.U32),
)


def _queue_row(q: NlAttrs) -> NlAttrs:
    q = dict(q)
    if "type" in q:
        q["type"] = QUEUE_TYPE.get(q["type"], str(q["type"]))
    return q


def dev_get(dev: Device) -> NlAttrs:
    return dev.genl_do(FAMILY, n.NETDEV_CMD_DEV_GET, DEV, {"ifindex": dev.ifindex},
                       what="netdev dev-get") or {}


def queue_get(dev: Device, qid: int, qtype: str = "rx") -> NlAttrs:
    try:
        r = dev.genl.do(FAMILY, n.NETDEV_CMD_QUEUE_GET, QUEUE,
                        {"ifindex": dev.ifindex, "type": QUEUE_TYPE_VALUE[qtype], "id": qid},
                        what=f"{qtype} queue {qid}")
    except NetlinkError as exc:
        if exc.errno in (errno.ENOENT, errno.EINVAL):
            raise UsageError(f"{dev.where} has no {qtype} queue {qid}" +
                             (f" ({exc.extack})" if exc.extack else ""),
                             "queues are numbered from 0; 'zcnet nic show' lists them; the "
                             "device must be up") from None
        dev.translate(exc, f"{qtype} queue {qid}", "queue listing (queue-get)")
    return _queue_row(r or {})


def queues(dev: Device) -> list[NlAttrs]:
    rows = dev.genl_dump(FAMILY, n.NETDEV_CMD_QUEUE_GET, QUEUE, {"ifindex": dev.ifindex},
                         what="queues", setting="queue listing (queue-get)")
    return [_queue_row(r) for r in rows if r.get("ifindex", dev.ifindex) == dev.ifindex]


def napis(dev: Device) -> list[NlAttrs]:
    rows = dev.genl_dump(FAMILY, n.NETDEV_CMD_NAPI_GET, NAPI, {"ifindex": dev.ifindex},
                         what="NAPI instances")
    return [r for r in rows if r.get("ifindex", dev.ifindex) == dev.ifindex]


def napi_get(dev: Device, napi_id: int) -> NlAttrs:
    return dev.genl_do(FAMILY, n.NETDEV_CMD_NAPI_GET, NAPI, {"id": napi_id},
                       what=f"NAPI {napi_id}") or {}


def page_pools(dev: Device) -> list[NlAttrs]:
    """Page pools of this device (the kernel dumps all; filtered here)."""
    rows = dev.genl_dump(FAMILY, n.NETDEV_CMD_PAGE_POOL_GET, PAGE_POOL, {},
                         what="page pools", setting="page pool listing")
    return [r for r in rows if r.get("ifindex") == dev.ifindex]


def page_pool_stats(dev: Device) -> list[NlAttrs]:
    """Allocation/recycling counters per page pool of this device (CONFIG_PAGE_POOL_STATS)."""
    try:
        rows = dev.genl.dump(FAMILY, n.NETDEV_CMD_PAGE_POOL_STATS_GET, PAGE_POOL_STATS, {},
                             what="page pool stats")
    except NetlinkError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            raise Unsupported("page pool stats: kernel built without CONFIG_PAGE_POOL_STATS",
                              "rebuild the kernel with CONFIG_PAGE_POOL_STATS=y") from None
        dev.translate(exc, "page pool stats", None)
    return [r for r in rows if r.get("info", {}).get("ifindex") == dev.ifindex]


def qstats(dev: Device, per_queue: bool = True) -> list[NlAttrs]:
    attrs: NlAttrs = {"ifindex": dev.ifindex}
    if per_queue:
        attrs["scope"] = n.NETDEV_QSTATS_SCOPE_QUEUE
    rows = dev.genl_dump(FAMILY, n.NETDEV_CMD_QSTATS_GET, QSTATS, attrs,
                         what="queue stats", setting="queue stats (qstats-get)")
    out = []
    for r in rows:
        if "queue-type" in r:
            r["queue-type"] = QUEUE_TYPE.get(r["queue-type"], str(r["queue-type"]))
        out.append(r)
    return out


def has_op(dev: Device, cmd: int) -> bool:
    """Whether this kernel's netdev family lists ``cmd`` (e.g. NETDEV_CMD_BIND_RX)."""
    try:
        return dev.genl.family(FAMILY).has_op(cmd)
    except NetlinkError:
        return False


NO_FD = 0xFFFFFFFF  # fd -1 as the u32 the kernel reads: dma_buf_get() fails with EBADF


class DmabufBinding:
    """A dma-buf bound to RX queues (``queues``) or to a device's TX (``queues`` empty). The
    binding lives exactly as long as this object's netlink socket: keep it open while receiving
    or sending, ``close()`` (or leave the ``with`` block) to unbind."""

    def __init__(self, sock: GenlSocket, binding_id: int, ifindex: int,
                 queue_ids: list[int]) -> None:
        self.sock = sock
        self.id = binding_id
        self.ifindex = ifindex
        self.queues = queue_ids

    def __enter__(self) -> DmabufBinding:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()


def bind_rx_request(ifindex: int, dmabuf_fd: int, queue_ids: Iterable[int]) -> NlAttrs:
    """The bind-rx request attributes (exposed for tests of the encoding)."""
    return {
        "ifindex": ifindex,
        "fd": dmabuf_fd,
        "queues": [{"id": q, "type": n.NETDEV_QUEUE_TYPE_RX} for q in queue_ids],
    }


def bind_tx_request(ifindex: int, dmabuf_fd: int) -> NlAttrs:
    """The bind-tx request attributes (exposed for tests of the encoding)."""
    return {"ifindex": ifindex, "fd": dmabuf_fd}


def _bind(dev: Device, cmd: int, request: NlAttrs, what: str, setting: str,
          queue_ids: list[int]) -> DmabufBinding:
    with ExitStack() as undo:
        # The binding lives as long as this socket: it is the caller's on success only.
        sock = GenlSocket(dev.netns, dev.genl.timeout)
        undo.callback(sock.close)
        try:
            r = sock.do(FAMILY, cmd, DMABUF, request, what=what)
        except NetlinkError as exc:
            dev.translate(exc, what, setting)
        if not r or "id" not in r:
            raise NetlinkError(errno.EIO, f"{what}: no binding id in reply")
        binding = DmabufBinding(sock, int(r["id"]), dev.ifindex, queue_ids)
        undo.pop_all()
    return binding


def bind_rx(dev: Device, dmabuf_fd: int, queue_ids: Iterable[int]) -> DmabufBinding:
    """Bind a dma-buf to RX queues of ``dev`` (devmem TCP); returns the live binding."""
    qids = list(queue_ids)
    return _bind(dev, n.NETDEV_CMD_BIND_RX, bind_rx_request(dev.ifindex, dmabuf_fd, qids),
                 f"bind dma-buf to queues {qids}", "devmem (bind-rx)", qids)


def bind_tx(dev: Device, dmabuf_fd: int) -> DmabufBinding:
    """Bind a dma-buf to ``dev`` for sending from it (devmem TX); returns the live binding."""
    return _bind(dev, n.NETDEV_CMD_BIND_TX, bind_tx_request(dev.ifindex, dmabuf_fd),
                 "bind dma-buf for TX", "devmem TX (bind-tx)", [])
