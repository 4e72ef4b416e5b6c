"""Every zero-copy provider by name: the one table the opener (``open_receiver``), the
receive engines, the benchmark's lists (zcnet.rx.registry) and zcnet.aio derive from, so no
caller dispatches on a provider's name.

Each provider has one round function (completions in, a ``Delivery`` out: its ``reap``) and at
most one C twin of it, named here (each compiled module lists its own twins too, in its
``TWINS`` dict).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from zcnet.rx.zc.devmem import DevmemProvider, open_devmem
from zcnet.rx.zc.provider import Provider
from zcnet.rx.zc.soft import SoftProvider, open_soft
from zcnet.rx.zc.zcrx import ZcrxProvider, open_zcrx

#: ``open_<name>(fd, area_size, **options)``: the provider, or a ZcnetError saying why not.
Opener = Callable[..., Provider]
#: What ``open_receiver`` hands an opener: its options, by name (``max_held`` is a float).
Option = str | int | float | bool | None


@dataclass(frozen=True)
class ProviderInfo:
    name: str
    cls: type
    open: Opener
    #: The open_receiver options this provider's opener takes.
    options: frozenset[str]
    #: ``Receiver.why`` when asked for by name; ``{note}``: the provider's own note.
    requested: str
    #: Registers a NIC queue (header-data split, the queue API): a device note in ``why``,
    #: registration ahead of the connection in an engine.
    needs_nic: bool
    #: How "auto" tries it, in table order: the ``why`` when it is taken (``{reasons}``: why
    #: the ones before it were not) and options added for the try.
    auto_why: str
    auto_options: Mapping[str, Option] = field(default_factory=dict)
    #: An option "auto" needs before it tries this provider, and the reason when it is None.
    auto_needs: tuple[str, str] | None = None
    #: zcnet.aio can put it on the event loop's shared ring (and pool).
    loop_ring: bool = False
    #: zcnet.aio receives it through its loop thread's queue (zcnet.aio.loop_zcrx).
    loop_queue: bool = False
    #: Its round function and that round's C twin, by qualified name.
    round: str = ""
    c_twin: str | None = None


PROVIDERS: Mapping[str, ProviderInfo] = MappingProxyType({i.name: i for i in (
    ProviderInfo("zcrx", ZcrxProvider, open_zcrx,
                 frozenset({"hugetlb", "dmabuf_fd", "ifname", "queue", "rx_buf_len"}),
                 "zcrx requested; {note}", needs_nic=True,
                 auto_why="zcrx: the socket's device supports it",
                 auto_options={"copy": False},  # auto takes zcrx only on a device
                 loop_queue=True,
                 round="zcnet.rx.zc.zcrx_rings.parse_completions",
                 c_twin="zcnet.rx.zc._rxaccel.zcrx_round"),
    ProviderInfo("devmem", DevmemProvider, open_devmem,
                 frozenset({"dmabuf_fd", "ifname", "queue"}), "devmem requested",
                 needs_nic=True, auto_why="devmem: {reasons}",
                 auto_needs=("dmabuf_fd", "no dma-buf given"),
                 round="zcnet.rx.zc.devmem.recv_devmem"),
    ProviderInfo("soft", SoftProvider, open_soft,
                 frozenset({"buf_size", "hugetlb", "incremental", "dmabuf_fd"}),
                 "soft provider requested", needs_nic=False, auto_why="soft, because {reasons}",
                 loop_ring=True, round="zcnet.rx.zc.soft_group.SoftGroup.round",
                 c_twin="zcnet.rx.zc._rxaccel.soft_round"),
)})
#: The order "auto" tries them in: the table's (the last is its last resort).
AUTO = tuple(PROVIDERS.values())


def provider_info(name: str) -> ProviderInfo | None:
    """The provider called ``name``, or None ("auto", a typo: the caller says which)."""
    return PROVIDERS.get(name)
