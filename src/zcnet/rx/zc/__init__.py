"""Zero-copy receive: zcrx, devmem and a software provider behind one buffer-lifetime API."""

from zcnet.rx.zc.area import Area
from zcnet.rx.zc.bookkeeping import Stats
from zcnet.rx.zc.chunks import Batch, Chunk
from zcnet.rx.zc.opener import open_receiver
from zcnet.rx.zc.receiver import Receiver

__all__ = ["Area", "Batch", "Chunk", "Receiver", "Stats", "open_receiver"]
