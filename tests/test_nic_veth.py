"""ethtool, netdev and ntuple against the real kernel, on a veth in a fresh namespace: what veth
supports works, what it lacks gives the documented errors."""

from __future__ import annotations

import errno
import os

import pytest

from zcnet.errors import Unsupported, UsageError, ZcnetError
from zcnet.lab import Lab
from zcnet.nic import doctor, ethtool, genl, info, netdev, ntuple
from zcnet.nic.device import Device, DeviceUnsupported
from zcnet.uapi import netdev as nd

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


def test_family_resolution_against_the_kernel(no_leaks):
    with genl.GenlSocket() as s:
        eth = s.family("ethtool")
        nd_fam = s.family("netdev")
        assert eth.id >= 0x10 and nd_fam.id >= 0x10 and eth.id != nd_fam.id
        assert eth.has_op(ethtool.e.ETHTOOL_MSG_RINGS_GET)
        assert nd_fam.has_op(nd.NETDEV_CMD_QUEUE_GET)
        assert s.family("ethtool") is eth  # cached
        with pytest.raises(genl.NetlinkError, match="not found") as exc:
            s.family("zcnet-nofam")
        assert exc.value.errno == errno.ENOENT
        with pytest.raises(ZcnetError, match="cannot be a generic netlink family name"):
            s.family("zcnet-name-longer-than-16")


@pytest.fixture(scope="module")
def lab():
    with Lab() as lab:
        yield lab


@pytest.fixture
def dev(lab, no_leaks):
    with Device.open(lab.if_a, lab.ns_a) as d:
        yield d



@pytest.mark.root
def test_unknown_interface_is_named(lab, no_leaks):
    with pytest.raises(ZcnetError, match="no network interface named 'zz-nope'"):
        Device("zz-nope", lab.ns_a)
    env = info.nic_env("zz-nope", lab.ns_a)
    assert env["ifname"] == "zz-nope" and "zz-nope" in env["error"]


@pytest.mark.root
def test_unknown_namespace_is_named(no_leaks):
    with pytest.raises(ZcnetError, match="zcnet-no-such-ns"):
        Device("lo", "zcnet-no-such-ns")


@pytest.mark.root
def test_driver_info(dev):
    d = dev.drvinfo()
    assert d.driver == "veth"
    assert dev.ifindex > 0


@pytest.mark.root
def test_channels_get_set_round_trip(dev):
    before = ethtool.channels_get(dev)
    assert before["rx-max"] >= 2 and before["rx-count"] >= 1
    target = 2 if before["rx-count"] != 2 else 1
    ethtool.channels_set(dev, rx_count=target)
    try:
        assert ethtool.channels_get(dev)["rx-count"] == target
        rx_ids = sorted(q["id"] for q in netdev.queues(dev) if q["type"] == "rx")
        assert rx_ids == list(range(target))
    finally:
        ethtool.channels_set(dev, rx_count=before["rx-count"])
    assert ethtool.channels_get(dev) == before


@pytest.mark.root
def test_channels_beyond_max_is_refused_with_reason(dev):
    top = ethtool.channels_get(dev)["rx-max"]
    with pytest.raises(genl.NetlinkError) as exc:
        ethtool.channels_set(dev, rx_count=top + 1)
    assert exc.value.errno == errno.EINVAL
    assert exc.value.extack  # the kernel says which limit


@pytest.mark.root
def test_features_compact_and_verbose_agree(dev):
    verbose = ethtool.features_get(dev)
    compact = ethtool.features_get(dev, compact=True)
    for key in ("hw", "wanted", "active", "nochange"):
        assert verbose[key].value == compact[key].value, key
    assert "rx-gro" in verbose["hw"].value  # veth lets GRO be switched


@pytest.mark.root
@pytest.mark.parametrize("compact", [False, True])
def test_features_set_round_trip(dev, compact):
    was = "rx-gro-list" in ethtool.features_get(dev)["active"].value
    ethtool.features_set(dev, {"rx-gro-list": not was}, compact=compact)
    try:
        assert ("rx-gro-list" in ethtool.features_get(dev)["active"].value) is (not was)
    finally:
        ethtool.features_set(dev, {"rx-gro-list": was})
    assert ("rx-gro-list" in ethtool.features_get(dev)["active"].value) is was


@pytest.mark.root
def test_fixed_feature_is_unsupported_and_unknown_is_usage(dev):
    with pytest.raises(DeviceUnsupported, match="driver veth does not support rx-ntuple-filter"):
        ethtool.features_set(dev, {"rx-ntuple-filter": True})
    with pytest.raises(UsageError, match="unknown feature ntuple-typo"):
        ethtool.features_set(dev, {"ntuple-typo": True})


@pytest.mark.root
@pytest.mark.parametrize("call, setting", [
    (lambda d: ethtool.rings_set(d, tcp_data_split="on"), "tcp-data-split"),
    (lambda d: ethtool.rings_set(d, hds_thresh=0), "hds-thresh"),
    (lambda d: ethtool.rings_get(d), "rings"),
    (lambda d: ethtool.privflags_get(d), "private flags"),
    (lambda d: ethtool.rss_get(d), "RSS"),
    (lambda d: ethtool.rss_create(d, [1]), "RSS contexts"),
    (lambda d: ntuple.rule_insert(d, "tcp4", 9999, 1), "ntuple flow rules"),
    (lambda d: ntuple.rule_count(d), "ntuple flow rules"),
    (lambda d: ethtool.privflags_set(d, {"x": True}), "private flag x"),
    (lambda d: netdev.qstats(d), "queue stats"),
])
def test_what_veth_lacks_names_the_setting(dev, call, setting):
    with pytest.raises(DeviceUnsupported) as exc:
        call(dev)
    assert str(exc.value).startswith(f"driver veth does not support {setting}")
    assert exc.value.errno == errno.EOPNOTSUPP


@pytest.mark.root
def test_bad_ring_settings_are_usage_errors(dev):
    with pytest.raises(UsageError, match="tcp-data-split 'maybe'"):
        ethtool.rings_set(dev, tcp_data_split="maybe")
    with pytest.raises(UsageError, match="unknown ring setting rx-max"):
        ethtool.rings_set(dev, rx_max=4)


@pytest.mark.root
def test_queue_get_dump_and_single(dev):
    rows = netdev.queues(dev)
    assert {(q["type"], q["id"]) for q in rows} >= {("rx", 0), ("tx", 0)}
    assert all(q["ifindex"] == dev.ifindex for q in rows)
    assert netdev.queue_get(dev, 0) == next(q for q in rows if q == {**q, "type": "rx", "id": 0})
    with pytest.raises(UsageError, match="has no rx queue 7"):
        netdev.queue_get(dev, 7)


@pytest.mark.root
def test_napi_get_once_gro_is_on(dev):
    was = "rx-gro" in ethtool.features_get(dev)["active"].value
    ethtool.features_set(dev, {"rx-gro": True})
    try:
        napis = netdev.napis(dev)
        assert napis, "veth registers NAPI instances while GRO is on"
        one = netdev.napi_get(dev, napis[0]["id"])
        assert one["id"] == napis[0]["id"] and one["ifindex"] == dev.ifindex
    finally:
        ethtool.features_set(dev, {"rx-gro": was})


@pytest.mark.root
def test_dev_get_and_ops_list(dev):
    d = netdev.dev_get(dev)
    assert d["ifindex"] == dev.ifindex and "xdp-features" in d
    assert netdev.has_op(dev, nd.NETDEV_CMD_BIND_RX)


@pytest.mark.root
def test_bind_rx_reaches_the_kernel_and_is_refused(dev):
    # Not a dma-buf (and veth has no queue management ops): the kernel must refuse, and the
    # binding socket must not outlive the failure.
    fd = os.memfd_create("zcnet-not-a-dmabuf", os.MFD_CLOEXEC)
    try:
        with pytest.raises(ZcnetError) as exc:
            netdev.bind_rx(dev, fd, [0])
        assert getattr(exc.value, "errno", None) in (errno.EBADF, errno.EINVAL, errno.EOPNOTSUPP)
    finally:
        os.close(fd)


@pytest.mark.root
def test_show_is_tolerant_and_complete(dev):
    s = info.show(dev)
    assert s["driver"]["driver"] == "veth"
    assert s["rings"] == {"unsupported": "driver veth does not support rings"}
    assert s["features"]["ntuple"] == "off [fixed]"
    assert isinstance(s["queues"], list) and s["queues"]


@pytest.mark.root
def test_nic_env(lab, no_leaks):
    env = info.nic_env(lab.if_a, lab.ns_a)
    assert env["driver"] == "veth"
    assert env["channels"]["rx-max"] >= 2
    assert "unsupported" in env["rings"] and "hds" not in env


@pytest.mark.root
def test_doctor_on_veth(dev):
    checks = {c.name: c for c in doctor.run(dev, queues=1, mode="zcrx")}
    assert not doctor.all_pass(list(checks.values()))
    assert checks["driver: queue management ops"].status == doctor.FAIL
    assert checks["HDS supported (tcp-data-split)"].status == doctor.FAIL
    assert checks["ntuple filters on"].status == doctor.FAIL
    assert checks["IOMMU"].status == doctor.UNKNOWN
    assert all(c.fix for c in checks.values() if c.status == doctor.FAIL)
    devmem = {c.name: c for c in doctor.run(dev, queues=0, mode="devmem")}
    assert devmem["kernel: devmem TCP"].status == doctor.PASS
    assert devmem["queue 0 free of providers"].status == doctor.PASS


@pytest.mark.root
def test_page_pool_stats_missing_names_the_kernel_config(dev):
    try:
        netdev.page_pool_stats(dev)
    except Unsupported as exc:
        assert "CONFIG_PAGE_POOL_STATS" in str(exc)
    else:
        pytest.skip("page-pool stats are readable on this kernel: the error cannot be shown")


@pytest.mark.root
def test_page_pool_stats_rows_belong_to_the_device(dev):
    try:
        rows = netdev.page_pool_stats(dev)
    except Unsupported as exc:
        pytest.skip(f"no page-pool stats on this kernel: {exc.message}")
    if not rows:
        pytest.skip(f"{dev.ifname} has no page pool now (veth makes one for XDP or GRO)")
    assert all(r["info"]["ifindex"] == dev.ifindex for r in rows)


@pytest.mark.root
def test_doctor_picks_a_queue_the_device_has(dev):
    """Without --queue: the device's last RX queue; a --queue it lacks is a usage error that
    names the queues it has."""
    before = ethtool.channels_get(dev)
    top = before["rx-max"]  # veth: one per CPU, 2 or more
    ethtool.channels_set(dev, rx_count=top)
    try:
        assert doctor.rx_queues(dev) == list(range(top))
        assert doctor.pick_queues(dev, None) == (top - 1,)
        assert doctor.pick_queues(dev, [0]) == (0,)
        with pytest.raises(UsageError, match=rf"has no RX queue {top} \(its RX queues: "
                                             rf"0\.\.{top - 1}\)"):
            doctor.pick_queues(dev, [top])
    finally:
        ethtool.channels_set(dev, rx_count=before["rx-count"])


def test_loopback_is_named_by_its_driver(no_leaks):
    """lo has no ethtool driver info: it is "loopback", not "?", in show, doctor and errors."""
    with Device.open("lo") as lo:
        assert lo.drvinfo().driver == "loopback" and lo.driver == "loopback"
        assert lo.flags() & 0x8  # IFF_LOOPBACK
        assert info.show(lo)["driver"]["driver"] == "loopback"
        assert info.show(lo)["channels"] == {
            "unsupported": "driver loopback does not support channels"}
        checks = {c.name: c for c in doctor.run(lo, doctor.pick_queues(lo, None))}
    qops = checks["driver: queue management ops"]
    assert (qops.status, qops.detail) == (doctor.FAIL,
                                          "driver loopback has no queue management ops")
    assert "queue 0 free of providers" in checks
    assert not any("driver ?" in c.detail for c in checks.values())


def test_doctor_cli_queue_it_lacks_is_one_line(no_leaks, capsys):
    from zcnet.cli import main

    assert main(["nic", "doctor", "lo", "--queue", "9"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["zcnet: error: lo has no RX queue 9 (its RX queues: 0)",
                   "zcnet: fix: give one of them, e.g. --queue 0, or leave --queue out"]
