"""Zero-copy receive: zcrx, devmem and a software provider behind one buffer-lifetime API.

The public API is ``api`` (re-exported here). Beneath it: ``chunks`` (what is handed out),
``receiver`` (the Receiver and its release path), ``debugviews`` (its debug mode), ``opener``
(choosing a provider), ``bookkeeping`` (release queue, stats), ``area`` (the registered memory);
``provider`` is the contract between the Receiver and the providers ``soft``/``soft_inc``,
``zcrx`` (with ``zcrx_reg`` and ``zcrx_rings``) and ``devmem``; ``netqueue`` finds the NIC queue
of a socket;
``engines`` runs them as ``zcnet bench`` engines.
"""

from zcnet.rx.zc.area import Area
from zcnet.rx.zc.bookkeeping import Stats
from zcnet.rx.zc.chunks import Batch, Chunk
from zcnet.rx.zc.opener import open_receiver
from zcnet.rx.zc.receiver import Receiver

__all__ = ["Area", "Batch", "Chunk", "Receiver", "Stats", "open_receiver"]
