"""Each compiled accelerator names the Python twin of every entry point (its ``TWINS`` dict):
the entry point exists in the module and the twin it names exists on the Python side, so a
rename on either side fails here instead of leaving a contract that points nowhere."""

from __future__ import annotations

import importlib

import pytest

MODULES = ("zcnet.uring._accel", "zcnet.rx.zc._rxaccel")


def _resolve(qualname: str) -> object:
    """The object a dotted name ``package.module.Attr.attr`` names (ImportError or
    AttributeError when it does not exist)."""
    parts = qualname.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(qualname)


@pytest.mark.parametrize("name", MODULES)
def test_every_entry_point_names_a_python_twin_that_exists(name: str) -> None:
    try:
        mod = importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not built (no C compiler)")
    twins = mod.TWINS
    assert twins, f"{name} declares no twins"
    for c_name, py_name in twins.items():
        assert hasattr(mod, c_name), f"{name}.{c_name} is listed but does not exist"
        _resolve(py_name)  # raises when the twin is gone


def test_the_provider_table_names_round_functions_and_twins_that_exist() -> None:
    from zcnet.rx.zc.providers import PROVIDERS

    for info in PROVIDERS.values():
        assert callable(_resolve(info.round)), info.name
        if info.c_twin is not None:
            try:
                twin = _resolve(info.c_twin)
            except ImportError:
                continue  # the accelerator is not built
            assert callable(twin), info.name


def test_the_round_changes_phase_only_as_the_core_table_says() -> None:
    """The compiled round re-arms (STOPPED + ARM) and stops (ARMED + STOP) a receive: the
    phases it writes are the core's TRANSITIONS entries, read at import, not its own."""
    from zcnet.aio import shared
    accel = shared.loop_accel()
    if accel is None:
        pytest.skip("the compiled pass is not built (or ZCNET_PURE is set)")
    from zcnet.rx.zc.core import TRANSITIONS, Event, Phase
    assert {
        "ARMED": Phase.ARMED, "STOPPED": Phase.STOPPED,
        "STOPPED+ARM": TRANSITIONS[Phase.STOPPED, Event.ARM],
        "ARMED+STOP": TRANSITIONS[Phase.ARMED, Event.STOP]} == accel.PHASES
