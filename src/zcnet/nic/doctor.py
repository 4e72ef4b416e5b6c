"""``zcnet nic doctor``: is this NIC ready for zero-copy receive on one or more RX queues? A
checklist in which every item is pass, fail or unknown, with the fix. Checks are a table of
functions; each reads what it needs and never raises for a missing piece (that is an "unknown"
or a "fail" with the reason)."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

from zcnet.caps import has_caps
from zcnet.errors import UsageError, ZcnetError
from zcnet.nic import ethtool, netdev
from zcnet.nic.device import Device
from zcnet.nic.nlattr import NlAttrs
from zcnet.nic.setup import STEERED_BY_PEER, int_tuple
from zcnet.nic.steps import queues_text
from zcnet.uapi import io_uring as u
from zcnet.uapi import netdev as nd
from zcnet.uapi.capability import CAP_IPC_LOCK
from zcnet.uring.ring import Ring

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"

# Drivers known to implement queue management ops (netdev_queue_mgmt_ops), which zcrx and
# devmem need to restart one queue with a new memory provider; and drivers known not to.
QMGMT_DRIVERS = frozenset({"mlx5_core", "bnxt_en", "gve", "fbnic", "netdevsim", "idpf"})
NO_QMGMT_DRIVERS = frozenset({"veth", "loopback", "dummy", "bridge", "tun", "virtio_net",
                              "ifb", "macvlan", "ipvlan", "vxlan", "geneve", "bonding"})
MEMLOCK_NEEDED = 64 << 20  # a few MiB of area plus refill ring; below this zcrx runs short
ZCRX_SYMBOL = b"io_register_zcrx_ifq"
BTF = Path("/sys/kernel/btf/vmlinux")
KALLSYMS = Path("/proc/kallsyms")
PROBE_DMABUF = 1 << 20
# Refusals the kernel gives only after it found the driver's queue management ops
# (net/core/netdev_rx_queue.c checks the ops first, then these).
_AFTER_QOPS = ("tcp-data-split is disabled", "hds-thresh is not zero",
               "designated queue already memory provider bound")


R = TypeVar("R")


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"check": self.name, "status": self.status, "detail": self.detail,
                "fix": self.fix}


@dataclass
class Context:
    dev: Device
    queues: tuple[int, ...]
    mode: str
    _cache: dict[str, object]  # key -> what its reader returned, or the ZcnetError it raised
    # Makes a dma-buf of N bytes (e.g. zcnet.rx.zc.area.udmabuf_create): lets the queue-ops
    # check ask the kernel with a devmem bind-rx instead of going by the driver's name.
    dmabuf: Callable[[int], int] | None = None

    def get(self, key: str, fn: Callable[[], R]) -> R | ZcnetError:
        """Read once per run; a refusal is stored as the ZcnetError it raised. A key is read
        by one reader, so what it holds is what that reader returns."""
        if key not in self._cache:
            try:
                self._cache[key] = fn()
            except ZcnetError as exc:
                self._cache[key] = exc
        return cast("R | ZcnetError", self._cache[key])

    def rings(self) -> NlAttrs | ZcnetError:
        return self.get("rings", lambda: ethtool.rings_get(self.dev))

    def queue(self, qid: int) -> NlAttrs | ZcnetError:
        return self.get(f"queue {qid}", lambda: netdev.queue_get(self.dev, qid))


def _kernel_has_symbol(symbol: bytes) -> bool | None:
    """Look in kallsyms (names are listed even when addresses are hidden), then in BTF's
    string table; None when neither can be read."""
    patterns = {KALLSYMS: (b" " + symbol + b"\n", b" " + symbol + b"\t"),
                BTF: (b"\0" + symbol + b"\0",)}
    for path, needles in patterns.items():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        return any(n in data for n in needles)
    return None


def _ask_kernel_zcrx() -> bool | None:
    """Register a zcrx IFQ from an unmapped address on a ring set up as zcrx needs: a kernel with
    zcrx checks the ring flags, then fails to copy the argument (EFAULT); one built without it
    says EOPNOTSUPP, one that predates it EINVAL (unknown opcode). None: cannot tell."""
    try:
        ring = Ring(8, flags=u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN
                    | u.IORING_SETUP_CQE32)
    except OSError:
        return None
    try:
        # Not NULL (the generic code refuses a NULL argument with EINVAL): an unmapped page.
        ring.register(u.IORING_REGISTER_ZCRX_IFQ, 8, 1)
    except OSError as exc:
        return {errno.EFAULT: True, errno.EOPNOTSUPP: False, errno.EINVAL: False}.get(
            exc.errno or 0)
    finally:
        ring.close()
    return None


def check_zcrx(ctx: Context) -> Check:
    name = "kernel: io_uring zcrx"
    found = _kernel_has_symbol(ZCRX_SYMBOL)
    if found is None and (asked := _ask_kernel_zcrx()) is not None:
        return (Check(name, PASS, "the kernel took a zcrx registration (probe, EFAULT)")
                if asked else Check(name, FAIL, "the kernel refused the zcrx registration "
                                    "opcode", "Linux >= 6.15 built with CONFIG_IO_URING_ZCRX=y"))
    if found is None:
        return Check(name, UNKNOWN, "neither /proc/kallsyms nor BTF readable",
                     "run as root, or check CONFIG_IO_URING_ZCRX in the kernel config")
    if found:
        return Check(name, PASS, "io_register_zcrx_ifq present")
    return Check(name, FAIL, "kernel lacks io_uring zero-copy receive",
                 "Linux >= 6.15 built with CONFIG_IO_URING_ZCRX=y")


def check_devmem(ctx: Context) -> Check:
    name = "kernel: devmem TCP"
    if netdev.has_op(ctx.dev, nd.NETDEV_CMD_BIND_RX):
        return Check(name, PASS, "netdev family has bind-rx")
    return Check(name, FAIL, "netdev family lacks bind-rx",
                 "Linux >= 6.12 built with CONFIG_NET_DEVMEM=y")


def _ask_kernel_qmgmt(ctx: Context, name: str) -> Check | None:
    """Bind a small dma-buf to the queues (devmem bind-rx) and unbind it: the kernel's answer
    says whether the driver restarts single queues with a memory provider. This restarts each
    queue twice. None when it cannot ask (no dma-buf, no bind-rx)."""
    if ctx.dmabuf is None or not netdev.has_op(ctx.dev, nd.NETDEV_CMD_BIND_RX):
        return None
    try:
        fd = ctx.dmabuf(PROBE_DMABUF)
    except (ZcnetError, OSError):
        return None
    try:
        with netdev.bind_rx(ctx.dev, fd, ctx.queues):
            pass
        return Check(name, PASS, f"the kernel bound a dma-buf to {queues_text(ctx.queues)} "
                                 "(probe, released at once)")
    except (ZcnetError, OSError) as exc:
        extack = getattr(exc, "extack", "") or ""
        err = getattr(exc, "errno", None)
        if any(extack.startswith(a) for a in _AFTER_QOPS):
            return Check(name, PASS, f"the kernel found them, then said: {extack}")
        if err == errno.EOPNOTSUPP:
            return Check(name, FAIL, "the kernel refused a dma-buf on "
                         f"{queues_text(ctx.queues)}: {extack or os.strerror(err)}",
                         "use a NIC whose driver restarts single queues with a memory "
                         "provider (mlx5, bnxt, gve, fbnic)")
        return Check(name, UNKNOWN, f"probe bind-rx failed: {exc}")
    finally:
        os.close(fd)


def check_qmgmt(ctx: Context) -> Check:
    name = "driver: queue management ops"
    drv = ctx.dev.driver
    if any(isinstance(q := ctx.queue(qid), dict) and ("io-uring" in q or "dmabuf" in q)
           for qid in ctx.queues):
        return Check(name, PASS, "a memory provider is bound, so the driver has them")
    if (asked := _ask_kernel_qmgmt(ctx, name)) is not None:
        return asked
    if drv in QMGMT_DRIVERS:
        return Check(name, PASS, f"driver {drv} implements them")
    if drv in NO_QMGMT_DRIVERS:
        return Check(name, FAIL, f"driver {drv} has no queue management ops",
                     "use a NIC whose driver restarts single queues (mlx5, bnxt, gve, fbnic)")
    return Check(name, UNKNOWN, f"driver {drv}: not determinable from user space",
                 "try 'zcnet nic setup' and a zero-copy receive; EOPNOTSUPP means no")


def check_hds_supported(ctx: Context) -> Check:
    name = "HDS supported (tcp-data-split)"
    rings = ctx.rings()
    if isinstance(rings, ZcnetError):
        return Check(name, FAIL, rings.message, "a driver with header-data split")
    if "tcp-data-split" not in rings:
        return Check(name, FAIL, f"driver {ctx.dev.driver} does not report tcp-data-split",
                     "a driver with header-data split")
    return Check(name, PASS, f"tcp-data-split {rings['tcp-data-split']}")


def check_hds_on(ctx: Context) -> Check:
    name = "HDS on"
    rings = ctx.rings()
    state = None if isinstance(rings, ZcnetError) else rings.get("tcp-data-split")
    if state == "on":
        return Check(name, PASS, "tcp-data-split on")
    return Check(name, FAIL, f"tcp-data-split {state or 'not available'}",
                 f"zcnet nic setup {ctx.dev.ifname} ... (or ethtool -G {ctx.dev.ifname} "
                 "tcp-data-split on)")


def check_hds_thresh(ctx: Context) -> Check:
    name = "hds-thresh 0"
    rings = ctx.rings()
    value = None if isinstance(rings, ZcnetError) else rings.get("hds-thresh")
    if value == 0:
        return Check(name, PASS, "hds-thresh 0")
    return Check(name, FAIL, "hds-thresh " + ("not available" if value is None else str(value)),
                 f"ethtool -G {ctx.dev.ifname} hds-thresh 0")


def check_ntuple(ctx: Context) -> Check:
    name = "ntuple filters on"
    f = ctx.get("features", lambda: ethtool.features_get(ctx.dev))
    if isinstance(f, ZcnetError):
        return Check(name, UNKNOWN, f.message)
    if "rx-ntuple-filter" in f["active"].value:
        return Check(name, PASS, "rx-ntuple-filter on")
    no_ntuple = "rx-ntuple-filter" not in f["hw"].value
    if ctx.dev.driver in STEERED_BY_PEER and no_ntuple:
        return Check(name, PASS, f"not needed: {ctx.dev.driver} receives on the queue its peer "
                                 "transmitted on (steer with XPS on the peer); it has no ntuple")
    if no_ntuple:
        return Check(name, FAIL, f"driver {ctx.dev.driver} cannot turn ntuple filters on",
                     "a NIC with flow steering")
    return Check(name, FAIL, "rx-ntuple-filter off", f"ethtool -K {ctx.dev.ifname} ntuple on")


def check_channels(ctx: Context) -> Check:
    name = "channels >= 2"
    ch = ctx.get("channels", lambda: ethtool.channels_get(ctx.dev))
    if isinstance(ch, ZcnetError):
        return Check(name, UNKNOWN, ch.message)
    count = ch.get("combined-count", 0) or ch.get("rx-count", 0)
    qs = queues_text(ctx.queues)
    # Every queue, and one more for RSS to keep every other flow (as setup raises them).
    need = max(max(ctx.queues) + 1, len(ctx.queues) + 1)
    if count >= need:
        return Check(name, PASS, f"{count} RX channels, {qs} among them")
    top = ch.get("combined-max", 0) or ch.get("rx-max", 0)
    if top < need:
        return Check(name, FAIL, f"{count} RX channels, the device offers at most {top}",
                     "a NIC with more queues (or lower or fewer queues)")
    return Check(name, FAIL, f"{count} RX channels (max {top}); {qs} and RSS need {need}",
                 f"ethtool -L {ctx.dev.ifname} {'combined' if ch.get('combined-max') else 'rx'} "
                 f"{need}")


def check_queue_free(ctx: Context) -> Check:
    name = f"{queues_text(ctx.queues)} free of providers"
    busy = []
    for qid in ctx.queues:
        q = ctx.queue(qid)
        if isinstance(q, ZcnetError):
            return Check(name, FAIL, q.message, q.hint or "")
        if bound := [p for p in ("io-uring", "dmabuf", "xsk") if p in q]:
            busy.append(f"queue {qid}: {', '.join(bound)}" if len(ctx.queues) > 1
                        else ", ".join(bound))
    if busy:
        return Check(name, FAIL, f"already bound: {'; '.join(busy)}",
                     "close the program holding it (EEXIST otherwise) or pick another queue")
    return Check(name, PASS, "no io-uring, dmabuf or xsk provider")


def check_memlock(ctx: Context) -> Check:
    name = "RLIMIT_MEMLOCK"
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return Check(name, PASS, "unlimited")
    if has_caps(CAP_IPC_LOCK):
        return Check(name, PASS, f"{soft >> 10} KiB, but CAP_IPC_LOCK lifts it")
    if soft >= MEMLOCK_NEEDED:
        return Check(name, PASS, f"{soft >> 20} MiB")
    return Check(name, FAIL, f"{soft >> 10} KiB is too little to pin receive areas",
                 "ulimit -l unlimited (or LimitMEMLOCK=infinity in the service)")


def check_iommu(ctx: Context) -> Check:
    name = "IOMMU"
    units = sorted(p.name for p in Path("/sys/class/iommu").glob("*"))
    groups = list(Path("/sys/kernel/iommu_groups").glob("*"))
    bus = ""
    with contextlib.suppress(ZcnetError):
        bus = ctx.dev.drvinfo().bus_info
    if not bus:
        return Check(name, UNKNOWN, "virtual device: no DMA, no IOMMU group",
                     "run doctor on the physical NIC")
    group = Path("/sys/bus/pci/devices") / bus / "iommu_group"
    if group.exists():
        return Check(name, PASS, f"{bus} in IOMMU group {os.path.basename(os.readlink(group))}")
    if not units and not groups:
        return Check(name, PASS, "no IOMMU: DMA addresses are physical")
    return Check(name, FAIL, f"IOMMU present ({', '.join(units) or 'groups'}) but {bus} has no "
                 "group", "check iommu= on the kernel command line")


CHECKS: dict[str, tuple[Callable[[Context], Check], ...]] = {
    "zcrx": (check_zcrx, check_qmgmt, check_hds_supported, check_hds_on, check_hds_thresh,
             check_ntuple, check_channels, check_queue_free, check_memlock, check_iommu),
    "devmem": (check_devmem, check_qmgmt, check_hds_supported, check_hds_on, check_hds_thresh,
               check_ntuple, check_channels, check_queue_free, check_memlock, check_iommu),
}


def rx_queues(dev: Device) -> list[int]:
    """The device's RX queue ids (the netdev family lists them while the device is up)."""
    try:
        return sorted(q["id"] for q in netdev.queues(dev)
                      if q.get("type") == "rx" and isinstance(q.get("id"), int))
    except ZcnetError:
        return []


def pick_queues(dev: Device, queues: Sequence[int] | None) -> tuple[int, ...]:
    """The RX queues to check: ``queues`` if the device has them all, else a UsageError naming
    the queues it has; without any, its last RX queue (the one zero-copy setups dedicate, as
    the kernel's selftests do: RSS keeps the others). A device that lists no queues (down)
    keeps ``queues`` or 0, and the queue check says why."""
    ids = rx_queues(dev)
    if not queues:
        return (ids[-1] if ids else 0,)
    if ids and (missing := [q for q in queues if q not in ids]):
        have = f"{ids[0]}..{ids[-1]}" if len(ids) > 1 else str(ids[0])
        option = "--queue" if len(queues) == 1 else "--queues"
        raise UsageError(f"{dev.where} has no RX {queues_text(missing)} (its RX queues: {have})",
                         f"give {'one' if len(queues) == 1 else 'some'} of them, e.g. {option} "
                         f"{ids[-1]}, or leave {option} out")
    return tuple(queues)


def run(dev: Device, queues: int | Iterable[int] = 1, mode: str = "zcrx",
        dmabuf: Callable[[int], int] | None = None) -> list[Check]:
    ctx = Context(dev, int_tuple(queues), mode, {}, dmabuf)
    return [check(ctx) for check in CHECKS[mode]]


def all_pass(checks: list[Check]) -> bool:
    return all(c.status == PASS for c in checks)
