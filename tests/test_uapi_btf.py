"""Every io_uring struct and enum value in zcnet.uapi matches the running kernel's BTF."""

from __future__ import annotations

import ctypes

import pytest

from btf import Btf
from zcnet.uapi import io_uring as uapi


@pytest.fixture(scope="module")
def btf() -> Btf:
    b = Btf.load()
    if b is None:
        pytest.skip("no BTF at /sys/kernel/btf/vmlinux or no bpftool")
    return b


@pytest.mark.parametrize("struct", uapi.STRUCTS, ids=lambda s: s.__name__)
def test_struct_layout_matches_btf(btf: Btf, struct: type[ctypes.Structure]) -> None:
    size, members = btf.layout(struct.__name__)
    assert ctypes.sizeof(struct) == size
    for name, _ctype in struct._fields_:
        f = getattr(struct, name)
        assert members[name] == (f.offset, f.size), name


def test_sqe_union_aliases_match_btf(btf: Btf) -> None:
    _, members = btf.layout("io_uring_sqe")
    for name, off, size in uapi.SQE_ALIASES:
        assert members[name] == (off, size), name


def test_enum_values_match_btf(btf: Btf) -> None:
    ours = {k: v for k, v in vars(uapi).items()
            if isinstance(v, int) and k.startswith(("IORING_", "IOU_", "IO_URING_"))}
    checked = [k for k in ours if k in btf.enums]
    assert len(checked) >= 40, "too few constants found in BTF enums to trust this check"
    wrong = {k: (ours[k], btf.enums[k]) for k in checked if ours[k] != btf.enums[k]}
    assert not wrong
