"""Zero-copy receive: zcrx, devmem and a software provider behind one buffer-lifetime API."""

from zcnet.rx.zc.api import Batch, Chunk, Receiver, open_receiver
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.bookkeeping import Stats

__all__ = ["Area", "Batch", "Chunk", "Receiver", "Stats", "open_receiver"]
