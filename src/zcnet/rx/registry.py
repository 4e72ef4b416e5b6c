"""Every receive engine and zero-copy provider by name: the one list the rest derives from.

The CLI's choices, the benchmark's default engine list, the server's checks and the report's
columns all come from here, so adding an engine is one entry below. The zero-copy engines
take what they are from their provider's entry in zcnet.rx.zc.providers (the providers'
table, which the opener and zcnet.aio use too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from zcnet.rx.copying import EpollEngine, UringEngine, UringMultishotEngine
from zcnet.rx.engine import Engine, EngineOptions
from zcnet.rx.zc.engines import DevmemEngine, SoftZcEngine, ZcrxEngine
from zcnet.rx.zc.providers import PROVIDERS, ProviderInfo

__all__ = ["ENGINES", "PROVIDERS", "EngineInfo", "ProviderInfo", "default_engines",
           "engine_names", "make_engine", "provider_names"]


@dataclass(frozen=True)
class EngineInfo:
    name: str
    factory: Callable[[EngineOptions], Engine]
    zero_copy: bool
    needs_nic: bool  # a NIC queue with header-data split (device memory or zcrx device mode)
    default: bool    # in `zcnet bench`'s default engine list


def _info(cls: Callable[[EngineOptions], Engine], *, default: bool = True) -> EngineInfo:
    """An engine's entry; a zero-copy engine's kind is its provider's."""
    name: str = cls.name  # type: ignore[attr-defined]
    provider = PROVIDERS.get(getattr(cls, "provider", ""))
    return EngineInfo(name, cls, provider is not None,
                      provider is not None and provider.needs_nic, default)


# Display order: copying engines first, then zero-copy ones from the most to the least portable.
ENGINES: Mapping[str, EngineInfo] = MappingProxyType({i.name: i for i in (
    _info(EpollEngine),
    _info(UringEngine),
    _info(UringMultishotEngine),
    _info(SoftZcEngine),
    _info(ZcrxEngine),
    # devmem cannot run without a NIC and a dma-buf, so a default run would only print n/a.
    _info(DevmemEngine, default=False),
)})


def engine_names() -> tuple[str, ...]:
    return tuple(ENGINES)


def provider_names() -> tuple[str, ...]:
    return tuple(PROVIDERS)


def default_engines() -> tuple[str, ...]:
    return tuple(name for name, info in ENGINES.items() if info.default)


def make_engine(name: str, options: EngineOptions | None = None) -> Engine:
    """The engine called ``name`` with ``options`` (defaults when None); a ValueError naming the
    choices for an unknown name."""
    try:
        info = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}") from None
    return info.factory(options or EngineOptions())
