"""zcnet in the asyncio event loop (placeholder docstring, replaced below)."""

from zcnet.aio.receiver import AsyncReceiver, open_receiver
from zcnet.aio.sockets import adopt_stream, adopt_transport, check_tcp_socket

__all__ = ["AsyncReceiver", "adopt_stream", "adopt_transport", "check_tcp_socket",
           "open_receiver"]
