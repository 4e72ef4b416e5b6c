"""Every io_uring struct and enum value, and every netdev.h constant, in zcnet.uapi matches the
running kernel's BTF.

Layout first seen in the 7.x headers (``uapi.NEWER_FIELDS``/``NEWER_ENUMS``) is skipped, with
the reason, on a kernel that lacks it (the host's 6.18); the ``vm`` variants run inside a 7.x
kernel (``zcnet vm run``) and require all of it.
"""

from __future__ import annotations

import ctypes
import platform

import pytest

from btf import Btf
from zcnet.uapi import io_uring as uapi
from zcnet.uapi import netdev as nd

PREFIXES = ("IORING_", "IOU_", "IO_URING_", "ZCRX_")
ALIASES = {"io_uring_sqe": uapi.SQE_ALIASES, "zcrx_ctrl": uapi.ZCRX_CTRL_ALIASES}


@pytest.fixture(scope="module")
def btf() -> Btf:
    b = Btf.load()
    if b is None:
        pytest.skip("no BTF at /sys/kernel/btf/vmlinux or no bpftool")
    return b


def layout_problems(btf: Btf, struct: type[ctypes.Structure],
                    allow_newer: bool) -> tuple[list[str], list[str]]:
    """(wrong, absent): fields whose offset/size differ from BTF, and 7.x fields this kernel
    lacks (only collected with ``allow_newer``; otherwise they count as wrong)."""
    name = struct.__name__
    newer = set(uapi.NEWER_FIELDS.get(name, ()))
    if ("STRUCT", name) not in btf.by_name:
        if allow_newer and newer:
            return [], [f"struct {name}"]
        return [f"struct {name} not in BTF"], []
    size, members = btf.layout(name)
    wrong: list[str] = []
    absent: list[str] = []
    if ctypes.sizeof(struct) != size:
        wrong.append(f"sizeof {ctypes.sizeof(struct)} != {size}")
    fields = [(f, getattr(struct, f).offset, getattr(struct, f).size) for f, _ in struct._fields_]
    for field, off, sz in [*fields, *ALIASES.get(name, ())]:
        if members.get(field) == (off, sz):
            continue
        if allow_newer and field in newer:
            absent.append(f"{name}.{field}")
        else:
            wrong.append(f"{field}: ours {(off, sz)}, BTF {members.get(field)}")
    return wrong, absent


def ours_enums() -> dict[str, int]:
    """Our constants, less the ``*_LAST`` sentinels: they count the ops of whichever kernel the
    headers came from (IORING_OP_LAST is 63 on 6.18, 65 on 7.2), so they differ by design."""
    return {k: v for k, v in vars(uapi).items()
            if isinstance(v, int) and k.startswith(PREFIXES) and not k.endswith("_LAST")}


@pytest.mark.parametrize("struct", uapi.STRUCTS, ids=lambda s: s.__name__)
def test_struct_layout_matches_btf(btf: Btf, struct: type[ctypes.Structure]) -> None:
    wrong, absent = layout_problems(btf, struct, allow_newer=True)
    assert not wrong
    if absent:
        pytest.skip(f"this kernel lacks 7.x layout {', '.join(absent)}; checked in the vm test")


def test_enum_values_match_btf(btf: Btf) -> None:
    ours = ours_enums()
    checked = [k for k in ours if k in btf.enums]
    assert len(checked) >= 40, "too few constants found in BTF enums to trust this check"
    wrong = {k: (ours[k], btf.enums[k]) for k in checked if ours[k] != btf.enums[k]}
    assert not wrong
    absent = [k for k in uapi.NEWER_ENUMS if k not in btf.enums]
    if absent:
        pytest.skip(f"this kernel lacks 7.x enum values {', '.join(absent)}; checked in the vm "
                    "test")


def test_newer_names_exist_in_uapi() -> None:
    ours = ours_enums()
    assert set(uapi.NEWER_ENUMS) <= set(ours)
    for name, fields in uapi.NEWER_FIELDS.items():
        struct = getattr(uapi, name)
        assert set(fields) <= {f for f, _ in struct._fields_}, name


@pytest.mark.vm
def test_7x_layout_and_enums_match_btf(btf: Btf) -> None:
    """Inside a 7.x kernel: every struct, 7.x fields included, and every enum value."""
    if not all(k in btf.enums for k in ("ZCRX_REG_NODEV", "IORING_REGISTER_ZCRX_CTRL")):
        pytest.skip("this kernel is older than the 7.x zcrx headers; run under `zcnet vm run`")
    problems = {s.__name__: layout_problems(btf, s, allow_newer=False)[0] for s in uapi.STRUCTS}
    assert not {k: v for k, v in problems.items() if v}
    ours = ours_enums()
    assert all(k in btf.enums for k in uapi.NEWER_ENUMS)
    wrong = {k: (ours[k], btf.enums[k]) for k in ours if k in btf.enums and ours[k] != btf.enums[k]}
    assert not wrong


# --- linux/netdev.h -----------------------------------------------------------------------------

def netdev_enums() -> dict[str, int]:
    return {k: v for k, v in vars(nd).items() if k.startswith("NETDEV_") and isinstance(v, int)}


def kernel_version() -> tuple[int, int]:
    major, minor = platform.release().split(".")[:2]
    return int(major), int(minor)


def test_netdev_values_match_btf(btf: Btf) -> None:
    """Every netdev.h constant of ours that this kernel's BTF holds has its value; the ones
    first in newer headers (``nd.SINCE``) are checked where the kernel is that new."""
    ours = netdev_enums()
    checked = [k for k in ours if k in btf.enums]
    assert len(checked) >= 60, "too few netdev constants found in BTF to trust this check"
    assert not {k: (ours[k], btf.enums[k]) for k in checked if ours[k] != btf.enums[k]}
    newer = [k for k, since in nd.SINCE.items() if kernel_version() < since]
    if newer:
        pytest.skip(f"this kernel is older than the headers of {', '.join(newer)}")


@pytest.mark.vm
def test_7x_netdev_names_are_in_btf(btf: Btf) -> None:
    """Inside a 7.x kernel: the names first in 7.x headers exist, with our values."""
    want = {k: getattr(nd, k) for k, since in nd.SINCE.items() if kernel_version() >= since}
    if not want:
        pytest.skip("this kernel is older than the 7.x netdev headers; run under `zcnet vm run`")
    assert {k: btf.enums.get(k) for k in want} == want
