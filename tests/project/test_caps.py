"""zcnet.caps: one reader of CapEff for the lab, the NIC doctor and zcrx's memlock check."""

from __future__ import annotations

from pathlib import Path

import pytest

from zcnet import caps
from zcnet.uapi.capability import CAP_IPC_LOCK, CAP_NET_ADMIN, CAP_SYS_ADMIN


def _status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    path = tmp_path / "status"
    path.write_text(text)
    monkeypatch.setattr(caps, "STATUS", str(path))


def test_has_caps_needs_every_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mask = (1 << CAP_NET_ADMIN) | (1 << CAP_IPC_LOCK)
    _status(tmp_path, monkeypatch, f"Name:\tx\nCapPrm:\t{'f' * 16}\nCapEff:\t{mask:016x}\n")
    assert caps.effective_caps() == mask
    assert caps.has_caps(CAP_NET_ADMIN)
    assert caps.has_caps(CAP_NET_ADMIN, CAP_IPC_LOCK)
    assert not caps.has_caps(CAP_SYS_ADMIN)
    assert not caps.has_caps(CAP_NET_ADMIN, CAP_SYS_ADMIN)


def test_unreadable_status_falls_back_to_the_uid(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _status(tmp_path, monkeypatch, "Name:\tx\nCapEff:\tnot-hex\n")
    assert caps.effective_caps() is None
    monkeypatch.setattr(caps.os, "geteuid", lambda: 0)
    assert caps.has_caps(CAP_SYS_ADMIN)
    monkeypatch.setattr(caps.os, "geteuid", lambda: 1000)
    assert not caps.has_caps(CAP_SYS_ADMIN)


def test_this_process_matches_proc() -> None:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines()
                if x.startswith("CapEff:"))
    assert caps.effective_caps() == int(line.split()[1], 16)
