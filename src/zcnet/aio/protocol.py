"""Callback-style zero-copy receive: a protocol whose methods the loop's shared ring calls.

    class Echo(zcnet.aio.ZcProtocol):
        def connection_made(self, transport):
            self.transport = transport
        def chunk_received(self, chunk):        # a view into the receiver's area
            self.transport.write(chunk.data)    # sent (or copied into the write buffer) now
            chunk.release()

    transport = zcnet.aio.start_protocol(sock, Echo())

Why next to ``async for``: handing a chunk to a task costs a Future, a Task wake-up and a loop
iteration per message, which for request/response traffic is most of the server's CPU. Here
the shared ring's dispatch (:mod:`zcnet.aio.shared`) calls the receiver's round directly, and
the round calls ``chunk_received`` for each chunk: no Task, no Future.

Release semantics are those of every zcnet chunk: valid until released, from any thread.
Releasing inside the callback is the fast path (the buffer goes back to the kernel with the
next round). A protocol that keeps chunks holds area space; once it holds ``max_held`` of the
area delivery pauses until a release, then resumes by itself.

Sending: ``transport.write`` sends at once with a non-blocking ``send``; what the socket does
not take is copied into a write buffer and sent when it becomes writable (as asyncio
transports do), so a chunk's view may be written and the chunk released straight after.

The soft provider on the loop's shared ring and zcrx on the loop thread's queue
(``provider="zcrx"``, :mod:`zcnet.aio.loop_zcrx`) drive callbacks (devmem: use
:func:`~zcnet.aio.open_receiver`).
"""

from __future__ import annotations

import contextlib
import socket

from zcnet.aio.loop import Owner, running_loop, track, untrack
from zcnet.aio.loop_zcrx import ZcrxMember, open_zcrx_receiver
from zcnet.aio.receiver import AREA_SIZE, BUF_SIZE, open_shared_receiver
from zcnet.aio.shared import ROUND_AGAIN, ROUND_FALLBACK, MemberRing, TransportCalls, compiled_round
from zcnet.aio.sockets import check_tcp_socket
from zcnet.errors import ClosedError, UsageError
from zcnet.rx.zc.api import Chunk, Receiver, Stats
from zcnet.rx.zc.providers import Option, provider_info
from zcnet.sockcheck import set_rcvlowat


class ZcProtocol:
    """Base class for callback-style receivers; override what you need.

    ``chunk_received(chunk)`` gets each received chunk; the default passes ``chunk.data`` to
    ``data_received`` and releases the chunk when that returns (the view is then invalid:
    copy what must outlive the call). ``eof_received`` returning true keeps the transport open
    for writing; otherwise it closes. ``connection_lost(exc)`` comes once, last (exc None on a
    clean close, the stream's error or the callback's exception otherwise).
    """

    def connection_made(self, transport: ZcTransport) -> None:
        """The transport exists and receiving is armed."""

    def chunk_received(self, chunk: Chunk) -> None:
        try:
            self.data_received(chunk.data)
        finally:
            chunk.release()

    def data_received(self, data: memoryview) -> None:
        raise NotImplementedError("a ZcProtocol overrides chunk_received or data_received")

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        """The transport is closed: no more callbacks."""


class TransportState:
    """A transport's receive and send state: what its compiled round (zcnet.aio._loopaccel)
    is handed once and reads and writes in place."""

    __slots__ = ("closing", "eof", "failed", "fd", "held", "paused", "waiting_release", "wbuf")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.wbuf = bytearray()  # what the socket did not take yet
        self.closing = False     # close() asked; teardown once the write buffer is sent
        self.paused = False      # pause_reading()
        self.waiting_release = False  # delivery paused by max_held: a release resumes it
        self.eof = False
        self.failed = False      # a send failed: connection_lost(exc) reports it, writes drop
        self.held: list[Chunk] = []  # a round's chunks not yet given when reading paused


class ZcTransport:
    """The connection of one :class:`ZcProtocol`: zero-copy receive, buffered send.

    Owns the socket (closed with the transport). Use from the loop that started it.
    """

    # What zcnet.aio._loopaccel's round reads every pass (in place, no dict lookup); the rest
    # lives in the instance dict.
    __slots__ = ("__dict__", "__weakref__", "protocol", "st")

    def __init__(self, sock: socket.socket, rx: Receiver, protocol: ZcProtocol,
                 member: MemberRing | ZcrxMember) -> None:
        self._owner = Owner("zcnet.aio transport")
        self.loop = self._owner.loop
        self.sock = sock
        self.rx = rx
        self.protocol = protocol
        self.st = TransportState(sock.fileno())
        self._member = member   # where the ring's passes find it
        self._writing = False   # add_writer is on
        self._closed = False    # torn down: the receiver and socket are closed
        #: The compiled round (zcnet.aio._loopaccel), or None: the Python round only. It is
        #: handed the steps it calls back (their order: TransportCalls).
        self._fast = compiled_round(self, rx, member, TransportCalls(
            self._round_failed, self._put_back, self._send_failed, self._buffer_rest))
        if self._fast is not None and type(self).write is ZcTransport.write:
            # its write: no Python frame and no GIL release per send (a subclass's own stays)
            self.write = self._fast.write  # type: ignore[method-assign]
        track(self.loop, self)

    # --- receiving ----------------------------------------------------------------------------
    def _on_ready(self) -> None:
        """One or more kernel rounds for this connection, each chunk to the protocol. Called by
        the shared ring's dispatch (completions arrived), at start, and after a pause."""
        rx = self.rx
        m = self._member
        proto = self.protocol
        fast = self._fast
        st = self.st
        try:
            while not st.closing and not st.paused and not st.eof:
                if st.waiting_release:
                    st.waiting_release = False
                    rx.on_release(None)
                if fast is not None:  # the common round in C; anything else below
                    r = fast.run()
                    if r == ROUND_AGAIN:
                        continue
                    if r != ROUND_FALLBACK:
                        return
                chunks = rx.recv(0)
                if chunks:
                    it = iter(chunks)
                    for c in it:
                        try:
                            proto.chunk_received(c)
                        except BaseException:
                            st.held = list(it)  # never the protocol's: released at teardown
                            raise
                        if st.closing or st.paused:  # by the protocol, in the callback
                            self._put_back(list(it))
                            return
                    if m.inbox or not rx.core.armed:
                        continue  # more is here, or the receive must be re-armed
                    return
                if rx.eof:
                    st.eof = True
                    if not proto.eof_received():
                        self.close()
                    return
                if rx.stalled is not None:  # the protocol holds max_held of the area
                    st.waiting_release = True
                    rx.on_release(self._release_seen)
                    return
                if rx.core.armed:
                    return  # nothing yet: the next dispatch calls again
        except Exception as e:
            self._round_failed(e)

    def _round_failed(self, e: Exception) -> None:
        """A round raised: the stream's error (OSError: ConnectionResetError, ...) ends the
        connection; the protocol's is reported as asyncio does, then drops it. Also called by
        the compiled pass when the round it ran directly raised (TransportCalls)."""
        if not isinstance(e, OSError):
            self.loop.call_exception_handler({
                "message": "zcnet.aio protocol callback failed", "exception": e,
                "protocol": self.protocol, "transport": self})
        self._teardown(e)

    def _put_back(self, rest: list[Chunk]) -> None:
        """The chunks of a round after the protocol closed (released) or paused (given on
        resume) inside ``chunk_received`` (the compiled round's too: TransportCalls)."""
        if self.st.closing:
            if rest:
                self.rx.release_many(rest)
        else:
            self.st.held = rest

    def _release_seen(self) -> None:
        """A chunk was released while delivery was paused (any thread): resume in the loop."""
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self.loop.call_soon_threadsafe(self._resume)

    def _resume(self) -> None:
        if not self._closed:
            self._on_ready()

    def pause_reading(self) -> None:
        """No ``chunk_received`` until ``resume_reading`` (the kernel keeps filling buffers)."""
        self._owner.check()
        self.st.paused = True

    def resume_reading(self) -> None:
        self._owner.check()
        if self.st.paused:
            self.st.paused = False
            self.loop.call_soon(self._resume_held)

    def _resume_held(self) -> None:
        held, self.st.held = self.st.held, []
        try:
            for i, c in enumerate(held):
                if self.st.closing or self.st.paused:
                    self._put_back(held[i:])
                    return
                self.protocol.chunk_received(c)
        except Exception as e:
            self.loop.call_exception_handler({
                "message": "zcnet.aio protocol callback failed", "exception": e,
                "protocol": self.protocol, "transport": self})
            self._teardown(e)
            return
        self._resume()

    def is_reading(self) -> bool:
        return not (self.st.paused or self.st.closing)

    # --- sending ------------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data``: at once as far as the socket takes it, the rest copied and sent when
        it becomes writable. ``data`` may be a chunk's view; release the chunk afterwards."""
        self._owner.check()
        st = self.st
        if st.closing:
            if st.failed:
                return  # the send error reaches connection_lost; the bytes have nowhere to go
            raise ClosedError("write on a closing zcnet.aio transport")
        if st.wbuf:
            st.wbuf += data
            return
        if type(data) is not bytes:  # counts below are in bytes, whatever the item size
            data = memoryview(data).cast("B")
        n = len(data)
        if not n:
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as e:
            self._send_failed(e)
            return
        if sent < n:
            self._buffer_rest(data, sent)

    # The compiled write (zcnet.aio._loopaccel.Round.write) does the common case (open, nothing
    # buffered, the socket takes it all) and calls these two (handed to it as TransportCalls),
    # or ``write`` itself, for the rest.
    def _send_failed(self, e: OSError) -> None:
        """The peer reset or shut down: drop the connection (later, not inside write)."""
        self.st.closing = self.st.failed = True
        self.loop.call_soon(self._teardown, e)

    def _buffer_rest(self, data: bytes | bytearray | memoryview, sent: int) -> None:
        """Copy what the socket did not take; it goes when the socket is writable."""
        self.st.wbuf += memoryview(data).cast("B")[sent:]  # ``sent`` counts bytes, not items
        self.loop.add_writer(self.st.fd, self._on_writable)
        self._writing = True

    def _on_writable(self) -> None:
        try:
            sent = self.sock.send(self.st.wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._teardown(e)
            return
        del self.st.wbuf[:sent]
        if not self.st.wbuf:
            self._stop_writing()
            if self.st.closing:
                self._teardown(None)

    def _stop_writing(self) -> None:
        if self._writing:
            self._writing = False
            if not self.loop.is_closed():
                self.loop.remove_writer(self.st.fd)

    def get_write_buffer_size(self) -> int:
        return len(self.st.wbuf)

    def write_eof(self) -> None:
        """Shut down the sending side once the write buffer is sent (here: at once if empty)."""
        self._owner.check()
        if self.st.wbuf:
            raise ClosedError("write_eof with unsent data buffered",
                              "wait until get_write_buffer_size() is 0")
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    # --- lifetime -----------------------------------------------------------------------------
    @property
    def stats(self) -> Stats:
        return self.rx.stats

    def is_closing(self) -> bool:
        return self.st.closing

    def close(self) -> None:
        """Stop receiving, send what is buffered, then close; ``connection_lost(None)`` follows
        (from the loop, never inside this call). Chunks the protocol holds stay valid."""
        if self.st.closing:
            return
        self._owner.check()
        self.st.closing = True
        if not self.st.wbuf:
            # Not now: close() may come from inside the ring's dispatch, where cancelling the
            # receive (which waits on that ring) must not run.
            self.loop.call_soon(self._teardown, None)

    def abort(self) -> None:
        """Close now, dropping the write buffer."""
        self._owner.check()
        self.st.closing = True
        self.st.wbuf.clear()
        self.loop.call_soon(self._teardown, None)

    def _teardown(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        self.st.closing = self._closed = True
        untrack(self.loop, self)
        self._member.on_ready = None
        self._member.fast = None
        self._fast = None  # it refers back to the transport: both go now, not at a GC pass
        self.__dict__.pop("write", None)  # the round's, bound to it
        held, self.st.held = self.st.held, []
        try:
            self._stop_writing()
            if self.st.waiting_release:
                rx_release_off(self.rx)
            if held:
                self.rx.release_many(held)
            self.rx.close()
        finally:
            self.sock.close()
            try:
                self.protocol.connection_lost(exc)
            except Exception as e:
                self.loop.call_exception_handler({
                    "message": "zcnet.aio protocol connection_lost failed", "exception": e,
                    "protocol": self.protocol, "transport": self})

    def _shutdown(self) -> None:
        self._teardown(None)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "closing" if self.st.closing else "open"
        return f"<zcnet.aio transport fd={self.st.fd} {state}>"


class QueueTransport(ZcTransport):
    """A zcrx connection's transport: its member on the loop thread's queue is told when each
    round ends (the queue's buffers are shared: zcnet.aio.loop_zcrx) and leaves at teardown."""

    _member: ZcrxMember

    def _on_ready(self) -> None:
        super()._on_ready()
        if not self._closed:
            self._member.round_done()

    def _teardown(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        try:
            super()._teardown(exc)
        finally:
            self._member.leave()


def rx_release_off(rx: Receiver) -> None:
    with contextlib.suppress(ClosedError):
        rx.on_release(None)


def start_protocol(sock: socket.socket, protocol: ZcProtocol, *, provider: str = "soft",
                   area_size: int = AREA_SIZE, buf_size: int = BUF_SIZE, rcvlowat: int = 0,
                   pool: bool | int = False, **kw: Option) -> ZcTransport:
    """Receive on ``sock`` (a connected TCP socket, now owned by the transport) by calling
    ``protocol``'s methods from the event loop; returns the transport after
    ``protocol.connection_made``. Options as for :func:`~zcnet.aio.open_receiver` with the
    soft provider (``hugetlb``, ``max_held``, ``coalesce``, ``debug``, and ``rcvlowat`` and
    ``pool`` for bulk ingest only), or with ``provider="zcrx"`` (on the loop thread's zcrx
    queue; its options, and ``rcvlowat``)."""
    what = "zcnet.aio.start_protocol"
    check_tcp_socket(sock, what)
    info = provider_info(provider)
    if info is None or not (info.loop_ring or info.loop_queue):
        raise UsageError(f"{what}: provider {provider!r} cannot drive callbacks",
                         "use provider='soft' or 'zcrx', or open_receiver for the others")
    if info.loop_queue and pool is not False:
        raise UsageError(f"{what}: pool= is for soft receivers", "drop pool=")
    set_rcvlowat(sock, rcvlowat, what)
    with contextlib.ExitStack() as undo:
        member: MemberRing | ZcrxMember
        if info.loop_queue:
            rx, member = open_zcrx_receiver(running_loop(what), sock, area_size, kw, what)
            undo.callback(member.leave)
            cls: type[ZcTransport] = QueueTransport
        else:
            rx = open_shared_receiver(sock, area_size, buf_size, kw, what, pool)
            member, cls = rx.provider.member, ZcTransport  # type: ignore[attr-defined]
        undo.callback(rx.close)
        sock.setblocking(False)
        tr = cls(sock, rx, protocol, member)
        undo.pop_all()
    tr._member.on_ready = tr._on_ready
    tr._member.fast = tr._fast
    with contextlib.ExitStack() as undo:
        undo.callback(tr._teardown, None)
        protocol.connection_made(tr)
        undo.pop_all()
    tr.loop.call_soon(tr._resume)  # arms the receive (and takes what already arrived)
    return tr
