"""Review findings on the zero-copy receive path, on real loopback TCP sockets."""

from __future__ import annotations

import pytest

from zcnet.rx.zc import open_receiver

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


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


@pytest.mark.parametrize("incremental", [False, True])
def test_provider_close_interrupted_in_cancel_still_frees_its_buffer_ring(
        no_leaks, tcp_pair, monkeypatch, incremental: bool) -> None:
    from zcnet.rx.zc import provider, soft

    _client, server = tcp_pair
    prov = soft.open_soft(server.fileno(), 1 << 20, 64 << 10, incremental=incremental)
    try:
        prov.arm()
        buf = prov._buf

        def interrupted(*_a: object) -> bool:
            raise KeyboardInterrupt

        monkeypatch.setattr(provider, "cancel_multishot", interrupted)
        with pytest.raises(KeyboardInterrupt):
            prov.close()
        assert buf._mem.closed  # the buffer ring's memory went with the ring
    finally:
        prov.area.close()
