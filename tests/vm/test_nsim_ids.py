"""netdevsim lab device IDs: they name the owning lab, so leftovers are found without state."""

from __future__ import annotations

import pytest

from zcnet.lab import names, netdevsim


@pytest.mark.parametrize("lab", [names.owned(4194303, 7), names.owned(1, 300),
                                 names.persistent(0), names.persistent(5)])
def test_device_ids_round_trip_to_their_lab(lab):
    ids = {side: netdevsim.device_id(lab, side) for side in names.SIDES}
    assert ids["a"] != ids["b"] and all(0 < i < 2**31 for i in ids.values())
    for side, dev_id in ids.items():
        owner = netdevsim.owner_of(dev_id)
        assert owner == netdevsim.Owner(lab.owner, int(lab.name.split("x")[-1].removeprefix(
            "zcup")) % 128, side)


@pytest.mark.parametrize("foreign", [0, 1, 13, 1000, (1 << 30) - 1, 1 << 31])
def test_ids_of_other_users_are_not_ours(foreign):
    assert netdevsim.owner_of(foreign) is None


def test_missing_netdevsim_names_the_test_kernel(monkeypatch, tmp_path):
    monkeypatch.setattr(netdevsim, "SYSFS", tmp_path / "nope")
    with pytest.raises(netdevsim.NoNetdevsim, match="no netdevsim") as ei:
        netdevsim.require()
    assert "--kernel nsim" in (ei.value.hint or "")
    assert netdevsim.device_ids() == [] and netdevsim.sweep_orphans(set()) == []
