"""Generic netlink over a raw AF_NETLINK socket: family resolution, do and dump requests.

Errors keep the kernel's errno and its extack message (``NetlinkError``); every receive has a
timeout so a silent kernel or a lost reply cannot hang the caller. The socket is bound to the
network namespace it was opened in, which is how ``--netns`` works (see ``zcnet.netns``).
"""

from __future__ import annotations

import errno as errno_mod
import logging
import os
import socket
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from zcnet.errors import ClosedError, ZcnetError
from zcnet.netns import in_netns
from zcnet.nic import nlattr
from zcnet.nic.nlattr import T, attrset
from zcnet.uapi import genetlink as g
from zcnet.uapi.netlink import (
    NETLINK_CAP_ACK,
    NETLINK_EXT_ACK,
    NETLINK_GENERIC,
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_DUMP_INTR,
    NLM_F_MULTI,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    NLMSG_NOOP,
    NLMSG_OVERRUN,
    SOL_NETLINK,
)

log = logging.getLogger(__name__)

RECV_BUF = 1 << 18  # the kernel sizes dump skbs to the reader's buffer, up to 32 KiB+; be roomy
DEFAULT_TIMEOUT = 5.0


class NetlinkError(OSError, ZcnetError):
    """The kernel refused a request: ``errno`` as it said, ``extack`` its explanation (or '')."""

    def __init__(self, err: int, what: str, extack: str = "", hint: str | None = None) -> None:
        reason = extack or os.strerror(err)
        text = f"{what}: {reason}" + (f" ({os.strerror(err)})" if extack else "")
        OSError.__init__(self, err, text)
        self.message = text
        self.hint = hint
        self.extack = extack
        self.what = what

    def __str__(self) -> str:
        return self.message


CTRL_OP = attrset("op-attrs", (g.CTRL_ATTR_OP_ID, "id", T.U32),
                  (g.CTRL_ATTR_OP_FLAGS, "flags", T.U32))
CTRL_MCAST = attrset("mcast-group-attrs", (g.CTRL_ATTR_MCAST_GRP_NAME, "name", T.STRING),
                     (g.CTRL_ATTR_MCAST_GRP_ID, "id", T.U32))
CTRL = attrset(
    "ctrl-attrs",
    (g.CTRL_ATTR_FAMILY_ID, "family-id", T.U16),
    (g.CTRL_ATTR_FAMILY_NAME, "family-name", T.STRING),
    (g.CTRL_ATTR_VERSION, "version", T.U32),
    (g.CTRL_ATTR_HDRSIZE, "hdrsize", T.U32),
    (g.CTRL_ATTR_MAXATTR, "maxattr", T.U32),
    (g.CTRL_ATTR_OPS, "ops", T.INDEXED, CTRL_OP),
    (g.CTRL_ATTR_MCAST_GROUPS, "mcast-groups", T.INDEXED, CTRL_MCAST),
)


@dataclass(frozen=True)
class Family:
    name: str
    id: int
    version: int
    ops: dict[int, int]  # cmd -> GENL_* flags (do/dump capability)
    mcast_groups: dict[str, int]

    def has_op(self, cmd: int) -> bool:
        return cmd in self.ops


class GenlSocket:
    """One NETLINK_GENERIC socket. Use as a context manager; ``close()`` releases it.

    ``netns`` opens the socket inside that named namespace (under /run/netns); the socket then
    talks to that namespace for its whole life.
    """

    def __init__(self, netns: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        with ExitStack() as undo:
            with in_netns(netns):
                self.sock = socket.socket(socket.AF_NETLINK,
                                          socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_GENERIC)
            undo.callback(self.sock.close)
            self.sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
            self.sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
            self.sock.bind((0, 0))
            self.sock.settimeout(timeout)
            undo.pop_all()
        self.netns = netns
        self.timeout = timeout
        self._seq = 0
        self._families: dict[str, Family] = {}
        self._buf = bytearray(RECV_BUF)

    def __enter__(self) -> GenlSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the socket; idempotent. Afterwards every request raises ClosedError."""
        self.sock.close()

    def _check_open(self, method: str) -> None:
        if self.sock.fileno() < 0:
            raise ClosedError.of(self, method)

    def fileno(self) -> int:
        self._check_open("fileno")
        return self.sock.fileno()

    # ---------------------------------------------------------------- family resolution

    def family(self, name: str) -> Family:
        """Resolve a family by name (cached per socket); ``Unsupported``-style error if absent."""
        self._check_open("family")
        fam = self._families.get(name)
        if fam is not None:
            return fam
        if not name or len(name.encode()) >= g.GENL_NAMSIZ:
            raise ZcnetError(f"{name!r} cannot be a generic netlink family name "
                             f"(1..{g.GENL_NAMSIZ - 1} bytes)")
        try:
            replies = self._transact(g.GENL_ID_CTRL, g.CTRL_CMD_GETFAMILY, 1,
                                     nlattr.encode_attrs(CTRL, {"family-name": name}),
                                     NLM_F_REQUEST | NLM_F_ACK, f"resolve family {name}")
        except NetlinkError as exc:
            if exc.errno == errno_mod.ENOENT:
                raise NetlinkError(exc.errno, f"generic netlink family {name!r} not found",
                                   hint=f"this kernel lacks the {name} netlink family "
                                        "(too old or not built in)") from exc
            raise
        if not replies:
            raise nlattr.MalformedReply(f"no reply to family lookup for {name}")
        d = nlattr.decode_attrs(CTRL, replies[0][1])
        if "family-id" not in d:
            raise nlattr.MalformedReply(f"family lookup for {name} lacks the family id")
        fam = Family(
            name=name,
            id=d["family-id"],
            version=d.get("version", 1),
            ops={op["id"]: op.get("flags", 0) for op in d.get("ops", []) if "id" in op},
            mcast_groups={m["name"]: m["id"] for m in d.get("mcast-groups", [])
                          if "name" in m and "id" in m},
        )
        self._families[name] = fam
        return fam

    # ---------------------------------------------------------------- requests

    def do(self, family: str, cmd: int, request: nlattr.AttrSet, attrs: nlattr.NlRequest,
           reply: nlattr.AttrSet | None = None, what: str = "") -> nlattr.NlAttrs | None:
        """One request with NLM_F_ACK; returns the decoded reply, or None for an ack only."""
        self._check_open("do")
        fam = self.family(family)
        replies = self._transact(fam.id, cmd, fam.version, nlattr.encode_attrs(request, attrs),
                                 NLM_F_REQUEST | NLM_F_ACK, what or f"{family} cmd {cmd}")
        if not replies:
            return None
        return nlattr.decode_attrs(reply or request, replies[0][1])

    def dump(self, family: str, cmd: int, request: nlattr.AttrSet, attrs: nlattr.NlRequest,
             reply: nlattr.AttrSet | None = None, what: str = "") -> list[nlattr.NlAttrs]:
        """A dump request; returns every decoded object. Retries a dump the kernel marks as
        interrupted (the object list changed while it was being walked)."""
        self._check_open("dump")
        fam = self.family(family)
        body = nlattr.encode_attrs(request, attrs)
        for _ in range(3):
            try:
                replies = self._transact(fam.id, cmd, fam.version, body,
                                         NLM_F_REQUEST | NLM_F_DUMP, what or f"{family} dump")
            except _DumpInterrupted:
                continue
            return [nlattr.decode_attrs(reply or request, a) for _, a in replies]
        raise NetlinkError(errno_mod.EAGAIN, f"{what or family}: dump kept changing, gave up")

    def _send(self, data: bytes) -> None:
        self.sock.sendto(data, (0, 0))

    def _recv(self, what: str) -> memoryview:
        try:
            n, _anc, flags, _addr = self.sock.recvmsg_into([self._buf])
        except TimeoutError:
            raise NetlinkError(errno_mod.ETIMEDOUT,
                               f"{what}: no reply from the kernel in {self.timeout:g}s") from None
        if flags & socket.MSG_TRUNC:
            raise nlattr.MalformedReply(f"{what}: reply larger than {RECV_BUF} bytes")
        return memoryview(self._buf)[:n]

    def _transact(self, mtype: int, cmd: int, version: int, attrs: bytes, flags: int,
                  what: str) -> list[tuple[int, memoryview]]:
        """Send one request and collect ``(cmd, attrs)`` replies until the ack / NLMSG_DONE."""
        self._seq += 1
        seq = self._seq
        self._send(nlattr.encode_genl(mtype, cmd, version, flags, seq, attrs))
        dumping = bool(flags & NLM_F_DUMP == NLM_F_DUMP)
        out: list[tuple[int, memoryview]] = []
        interrupted = False
        while True:
            data = bytes(self._recv(what))  # copy: the buffer is reused by the next recv
            for msg in nlattr.iter_msgs(data):
                if msg.seq != seq:
                    log.debug("skipping stale netlink message seq %d (want %d)", msg.seq, seq)
                    continue
                if msg.flags & NLM_F_DUMP_INTR:
                    interrupted = True
                handler = _CONTROL.get(msg.type)
                if handler is not None:
                    finished = handler(msg, what)
                    if finished:
                        if interrupted:
                            raise _DumpInterrupted()
                        return out
                    continue
                out.append(nlattr.split_genl(msg.payload))
                if not dumping and not (msg.flags & NLM_F_MULTI) and not (flags & NLM_F_ACK):
                    return out


class _DumpInterrupted(Exception):
    pass


def _on_error(msg: nlattr.Message, what: str) -> bool:
    ack = nlattr.parse_error(msg)
    if ack.error:
        raise NetlinkError(-ack.error, what, ack.extack.get("msg", ""))
    return True


def _on_done(msg: nlattr.Message, what: str) -> bool:
    ack = nlattr.parse_done(msg)
    if ack.error:
        raise NetlinkError(-ack.error, what, ack.extack.get("msg", ""))
    return True


def _on_overrun(msg: nlattr.Message, what: str) -> bool:
    raise NetlinkError(errno_mod.ENOBUFS, f"{what}: netlink reply overrun")


def _on_noop(msg: nlattr.Message, what: str) -> bool:
    return False


# Control messages: type -> handler returning True when the request is complete.
_CONTROL: dict[int, Callable[[nlattr.Message, str], bool]] = {
    NLMSG_ERROR: _on_error,
    NLMSG_DONE: _on_done,
    NLMSG_OVERRUN: _on_overrun,
    NLMSG_NOOP: _on_noop,
}
