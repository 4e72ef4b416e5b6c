"""What a NIC looks like right now: driver, channels, rings and header-data split, offloads,
queues -> NAPI -> IRQ -> CPU, memory providers per queue, page pools and their stats.

Every section is read independently; a section the driver or kernel lacks becomes
``{"unsupported": reason}`` instead of failing the whole report.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias, TypeVar

from zcnet.errors import ZcnetError
from zcnet.jsonvalue import JSONObject, JSONValue
from zcnet.nic import ethtool, netdev, ntuple
from zcnet.nic.device import Device
from zcnet.nic.nlattr import NlAttrs, NlValue
from zcnet.uapi.ethtool import IFNAMSIZ, SIOCGIFADDR

# Features zcnet cares about: kernel name -> short label.
KEY_FEATURES = {
    "rx-gro": "gro",
    "rx-gro-hw": "hw-gro",
    "large-receive-offload": "lro",
    "rx-ntuple-filter": "ntuple",
    "rx-hashing": "rxhash",
    "rx-gro-list": "gro-list",
}


# A section of ``show``: netlink values, or what the device could not say (None).
Section: TypeAlias = "NlValue | None"
S = TypeVar("S")


def _section(fn: Callable[[], S]) -> S | dict[str, str]:
    """What ``fn`` reads, or ``{"unsupported": why}`` where the device or kernel refuses it."""
    try:
        return fn()
    except ZcnetError as exc:
        return {"unsupported": exc.message}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def irq_cpus(irq: int) -> dict[str, str | None]:
    """Affinity of an IRQ: what is allowed and where the kernel actually routes it."""
    base = Path("/proc/irq") / str(irq)
    return {"affinity": _read(base / "smp_affinity_list"),
            "effective": _read(base / "effective_affinity_list")}


def thread_cpu(pid: int) -> int | None:
    """The CPU a (threaded NAPI) kernel thread last ran on, field 39 of /proc/PID/stat."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    if not stat:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[36])
    except (IndexError, ValueError):
        return None


def queue_map(dev: Device) -> list[dict[str, Section]]:
    """RX and TX queues with their NAPI instance, its IRQ and CPUs, bound providers, and (RX)
    the page pools that NAPI allocates from."""
    napis = {n["id"]: n for n in netdev.napis(dev) if "id" in n}
    pools: dict[int, list[int]] = {}
    for pool in _section(lambda: netdev.page_pools(dev)) or []:
        if isinstance(pool, dict) and "napi-id" in pool and "id" in pool:
            pools.setdefault(pool["napi-id"], []).append(pool["id"])
    rows = []
    for q in netdev.queues(dev):
        row: dict[str, Section] = {"type": q.get("type"), "id": q.get("id"),
                                   "napi": q.get("napi-id")}
        providers = [name for name in ("io-uring", "dmabuf", "xsk") if name in q]
        row["providers"] = providers
        if q.get("type") == "rx":
            row["page_pools"] = sorted(pools.get(q.get("napi-id", -1), []))
        if "dmabuf" in q:
            row["dmabuf"] = q["dmabuf"]
        napi = napis.get(q.get("napi-id", -1))
        if napi:
            row["irq"] = napi.get("irq")
            if napi.get("irq"):
                row.update(irq_cpus(napi["irq"]))
            if napi.get("pid"):
                row["napi_thread"] = napi["pid"]
                row["napi_thread_cpu"] = thread_cpu(napi["pid"])
        rows.append(row)
    return rows


def rings_summary(dev: Device) -> NlAttrs:
    return ethtool.rings_get(dev)


def features_summary(dev: Device) -> NlAttrs:
    f = ethtool.features_get(dev)
    active, hw = f["active"].value, f["hw"].value
    out: NlAttrs = {label: ("on" if name in active else "off") +
                           ("" if name in hw else " [fixed]")
                           for name, label in KEY_FEATURES.items()}
    out["active"] = sorted(active)
    return out


def rss_summary(dev: Device) -> dict[str, Section]:
    r = ethtool.rss_get(dev)
    out: dict[str, Section] = {"hfunc": r.get("hfunc"), "indir": r.get("indir", []),
                           "hkey_len": len(r.get("hkey", b""))}
    out["contexts"] = _section(lambda: [
        {"context": c.get("context"), "indir": c.get("indir", [])}
        for c in ethtool.rss_contexts(dev)])
    return out


def show(dev: Device) -> dict[str, Section]:
    """Everything ``zcnet nic show`` reports, JSON-ready."""
    def drv() -> dict[str, str]:
        d = dev.drvinfo()
        return {"driver": d.driver, "version": d.version, "firmware": d.firmware,
                "bus_info": d.bus_info}

    return {
        "ifname": dev.ifname,
        "ifindex": dev.ifindex,
        "netns": dev.netns,
        "driver": _section(drv),
        "channels": _section(lambda: ethtool.channels_get(dev)),
        "rings": _section(lambda: rings_summary(dev)),
        "features": _section(lambda: features_summary(dev)),
        "private_flags": _section(lambda: ethtool.privflags_get(dev)),
        "rss": _section(lambda: rss_summary(dev)),
        "ntuple_rules": _section(lambda: ntuple.rule_count(dev)),
        "queues": _section(lambda: queue_map(dev)),
        "page_pools": _section(lambda: netdev.page_pools(dev)),
        "page_pool_stats": _section(lambda: netdev.page_pool_stats(dev)),
    }


def config_state(dev: Device) -> dict[str, object]:
    """The settings ``setup`` may change, without ids the kernel renumbers (NAPI ids): two equal
    results mean the device is configured the same (compared, never read)."""
    def feats() -> dict[str, list[str]]:
        f = ethtool.features_get(dev)
        return {"wanted": sorted(f["wanted"].value), "active": sorted(f["active"].value)}

    def queues() -> list[tuple[str, int, list[str]]]:
        return sorted((q.get("type", ""), q.get("id", -1),
                       [p for p in ("io-uring", "dmabuf", "xsk") if p in q])
                      for q in netdev.queues(dev))

    return {
        "channels": _section(lambda: ethtool.channels_get(dev)),
        "rings": _section(lambda: ethtool.rings_get(dev)),
        "features": _section(feats),
        "private_flags": _section(lambda: ethtool.privflags_get(dev)),
        "rss": _section(lambda: ethtool.rss_get(dev)),
        "rss_contexts": _section(lambda: ethtool.rss_contexts(dev)),
        "ntuple_rules": _section(lambda: ntuple.rule_count(dev)),
        "queues": _section(queues),
    }


def nic_env(ifname: str, netns: str | None = None) -> JSONObject:
    """NIC metadata for a result's JSON ``env``: driver, firmware, rings/HDS, channels.

    Never raises for a missing piece: an unknown interface or a refused query is recorded as
    such, so a benchmark can always write its envelope."""
    try:
        with Device.open(ifname, netns) as dev:
            env: JSONObject = {"ifname": ifname}
            if netns:
                env["netns"] = netns
            drv = _section(dev.drvinfo)
            if isinstance(drv, dict):
                env["driver"] = drv
            else:
                env.update(driver=drv.driver, firmware=drv.firmware, bus_info=drv.bus_info)
            rings = _section(lambda: ethtool.rings_get(dev))
            env["rings"] = _json(rings)
            if "unsupported" not in rings:
                env["hds"] = {"tcp-data-split": rings.get("tcp-data-split"),
                              "hds-thresh": rings.get("hds-thresh")}
            env["channels"] = _json(_section(lambda: ethtool.channels_get(dev)))
            feats = _section(lambda: features_summary(dev))
            if "unsupported" not in feats:
                feats.pop("active", None)
            env["features"] = _json(feats)
            return env
    except (ZcnetError, OSError) as exc:
        return {"ifname": ifname, "error": str(exc)}


def _json(value: Section | dict[str, str]) -> JSONValue:
    """A section as the JSON env holds it: binary payloads as hex text."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


def ipv4_of(ifname: str) -> str | None:
    """The IPv4 address of ``ifname`` (SIOCGIFADDR), or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR,
                              struct.pack("256s", ifname.encode()[:IFNAMSIZ - 1]))
        except OSError:
            return None
    return socket.inet_ntoa(raw[20:24])  # struct ifreq: name[16], sockaddr_in (port 2 + addr 4)


def ifname_for_address(addr: str) -> str | None:
    """The interface that holds IPv4 address ``addr`` (where a server listens), or None."""
    return next((name for _, name in socket.if_nameindex() if ipv4_of(name) == addr), None)
