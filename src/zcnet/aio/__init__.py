"""zcnet in the asyncio event loop (docstring completed below)."""

from zcnet.aio.receiver import AsyncReceiver, open_receiver
from zcnet.aio.sender import AsyncSender, Slot, open_sender
from zcnet.aio.sockets import adopt_stream, adopt_transport, check_tcp_socket

__all__ = ["AsyncReceiver", "AsyncSender", "Slot", "adopt_stream", "adopt_transport",
           "check_tcp_socket", "open_receiver", "open_sender"]
