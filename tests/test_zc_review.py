"""Review findings on the zero-copy receive path, on real loopback TCP sockets."""

from __future__ import annotations

import socket

import pytest

from zcnet.rx.zc import open_receiver


@pytest.fixture
def tcp_pair():
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    client = socket.create_connection(ls.getsockname())
    server, _ = ls.accept()
    ls.close()
    yield client, server
    client.close()
    server.close()


def test_close_unmaps_the_area_even_when_the_provider_close_is_interrupted(
        no_leaks, tcp_pair) -> None:
    """Ctrl-C while the provider cancels its receive must not leak the area (and the provider
    must still release its ring)."""
    client, server = tcp_pair
    rx = open_receiver(server, "soft", area_size=1 << 20, buf_size=64 << 10)
    client.sendall(b"x" * 1000)
    got = rx.recv(timeout=2)
    assert got
    rx.release_many(got)
    rx.flush()
    real_close = rx.provider.close

    def interrupted() -> None:
        real_close()
        raise KeyboardInterrupt

    rx.provider.close = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        rx.close()
    assert rx.area.closed
