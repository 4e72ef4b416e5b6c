"""The engine contract and the registry every engine and provider list derives from."""

from __future__ import annotations

import pytest

from zcnet.errors import UsageError
from zcnet.rx import registry
from zcnet.rx.engine import SOFT_AREA_BUFFERS, ZC_AREA_BUFFERS, ZC_BUF, EngineOptions
from zcnet.rx.zc.api import open_receiver


def test_engines_in_display_order_with_their_kind():
    assert registry.engine_names() == ("epoll", "uring", "uring-mshot", "soft-zc", "zcrx",
                                       "devmem")
    assert registry.default_engines() == ("epoll", "uring", "uring-mshot", "soft-zc", "zcrx")
    assert [n for n, i in registry.ENGINES.items() if i.zero_copy] == ["soft-zc", "zcrx",
                                                                        "devmem"]
    assert [n for n, i in registry.ENGINES.items() if i.needs_nic] == ["zcrx", "devmem"]
    for name, info in registry.ENGINES.items():
        engine = info.factory(EngineOptions())
        assert engine.name == name == info.name
        engine.close()


def test_providers_are_named_by_their_class():
    assert registry.provider_names() == ("zcrx", "devmem", "soft")
    assert all(i.cls.name == i.name == name for name, i in registry.PROVIDERS.items())
    # the engines' kinds come from their providers' entries
    by_provider = {n: i for n, i in registry.ENGINES.items() if i.zero_copy}
    assert [i.factory.provider for i in by_provider.values()] == ["soft", "zcrx", "devmem"]


def test_make_engine_names_the_choices_for_an_unknown_engine():
    with pytest.raises(ValueError, match="unknown engine 'nope'; choose from epoll, uring"):
        registry.make_engine("nope", EngineOptions())
    assert registry.make_engine("epoll").opts == EngineOptions()


def test_unknown_provider_lists_every_provider(tcp_pair):
    a, _ = tcp_pair
    with pytest.raises(UsageError, match="unknown zero-copy provider 'nope'") as e:
        open_receiver(a, "nope")
    assert e.value.hint == f"choose one of {', '.join(registry.provider_names())}, auto"


def test_area_sizing_defaults_and_overrides():
    assert EngineOptions().area_bytes() == ZC_AREA_BUFFERS * ZC_BUF
    assert EngineOptions(zc_buf=4096).area_bytes() == ZC_AREA_BUFFERS * 4096
    assert EngineOptions(zc_buf=4096, zc_area=1 << 20).area_bytes() == 1 << 20
    assert EngineOptions(mshot_buf=4096, mshot_entries=8).mshot_ring_bytes() == 8 * 4096


def test_soft_zc_default_area_is_small_and_the_option_still_wins():
    """soft-zc's default area holds SOFT_AREA_BUFFERS buffers (cache-resident copy target);
    zcrx and devmem keep ZC_AREA_BUFFERS (a NIC queue fills from theirs)."""
    def area(engine: str, **opts: int) -> int:
        return registry.make_engine(engine, EngineOptions(**opts)).area_size  # type: ignore[attr-defined]

    assert area("soft-zc") == SOFT_AREA_BUFFERS * ZC_BUF
    assert area("soft-zc", zc_buf=4096) == SOFT_AREA_BUFFERS * 4096
    assert area("soft-zc", zc_area=8 << 20) == 8 << 20
    for nic in ("zcrx", "devmem"):
        assert area(nic) == ZC_AREA_BUFFERS * ZC_BUF


def test_options_from_pairs_are_checked():
    o = EngineOptions.from_mapping({"queue": 3, "ifname": "eth0", "zc_debug": True},
                                   bufsize=4096)
    assert (o.queue, o.ifname, o.zc_debug, o.bufsize) == (3, "eth0", True, 4096)
    assert EngineOptions.from_mapping({"consumer_cpu": None}).consumer_cpu is None
    with pytest.raises(UsageError, match="unknown engine option 'quue'") as e:
        EngineOptions.from_mapping({"quue": 3})
    assert e.value.hint is not None and "queue" in e.value.hint
    with pytest.raises(UsageError, match="engine option queue='3': expected int"):
        EngineOptions.from_mapping({"queue": "3"})
    with pytest.raises(UsageError, match="engine option zc_buf=True"):
        EngineOptions.from_mapping({"zc_buf": True})
