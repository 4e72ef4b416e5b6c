"""Named prep helpers, liburing style: each is a thin call of ``Ring.prep`` with its opcode.

Variants are suffixes (``_fixed``, ``_multishot``). They return the SQE slot index.
"""

from __future__ import annotations

from zcnet.errors import UsageError
from zcnet.uapi import io_uring as u
from zcnet.uring.ring import Ring


def prep_nop(ring: Ring, user_data: int = 0) -> int:
    return ring.prep(u.IORING_OP_NOP, -1, 0, 0, 0, user_data)


def prep_recv(ring: Ring, fd: int, addr: int, length: int, user_data: int = 0,
              msg_flags: int = 0) -> int:
    return ring.prep(u.IORING_OP_RECV, fd, addr, length, user_data=user_data, op_flags=msg_flags)


def prep_read_fixed(ring: Ring, fd: int, addr: int, length: int, buf_index: int,
                    user_data: int = 0, offset: int = -1) -> int:
    """READ_FIXED from a registered buffer; offset -1 reads at the file's position (sockets)."""
    return ring.prep(u.IORING_OP_READ_FIXED, fd, addr, length, offset & 0xFFFFFFFFFFFFFFFF,
                     user_data=user_data, buf_index=buf_index)


def prep_recv_multishot(ring: Ring, fd: int, bgid: int, user_data: int = 0, *,
                        bundle: bool = False, msg_flags: int = 0, limit: int = 0) -> int:
    """Multishot RECV selecting buffers from provided-buffer group ``bgid``. ``limit``: the
    receive ends (its CQE without F_MORE) once it has taken that many bytes in all (the SQE's
    ``optlen``; kernels without the cap refuse a nonzero one with -EINVAL)."""
    if not 0 <= limit <= 0x7FFFFFFF:  # the kernel reads it as an int: larger is negative
        raise UsageError(f"receive limit {limit} is not 0..2**31-1 bytes",
                         "cap a receive at less than 2 GiB (0: no cap)")
    ioprio = u.IORING_RECV_MULTISHOT | (u.IORING_RECVSEND_BUNDLE if bundle else 0)
    return ring.prep(u.IORING_OP_RECV, fd, 0, 0, user_data=user_data, flags=u.IOSQE_BUFFER_SELECT,
                     ioprio=ioprio, op_flags=msg_flags, buf_index=bgid, file_index=limit)


def prep_send(ring: Ring, fd: int, addr: int, length: int, user_data: int = 0,
              msg_flags: int = 0) -> int:
    return ring.prep(u.IORING_OP_SEND, fd, addr, length, user_data=user_data, op_flags=msg_flags)


def prep_send_zc(ring: Ring, fd: int, addr: int, length: int, user_data: int = 0,
                 msg_flags: int = 0, *, report_usage: bool = True) -> int:
    """SEND_ZC: one CQE for the send (F_MORE set) and later one with F_NOTIF when the kernel
    no longer needs the memory. With report_usage the notification's res carries
    IORING_NOTIF_USAGE_ZC_COPIED when the kernel copied after all."""
    ioprio = u.IORING_SEND_ZC_REPORT_USAGE if report_usage else 0
    return ring.prep(u.IORING_OP_SEND_ZC, fd, addr, length, user_data=user_data, ioprio=ioprio,
                     op_flags=msg_flags)


def prep_send_zc_fixed(ring: Ring, fd: int, addr: int, length: int, buf_index: int,
                       user_data: int = 0, msg_flags: int = 0, *,
                       report_usage: bool = True) -> int:
    """SEND_ZC from registered buffer ``buf_index`` (``addr`` lies inside it)."""
    ioprio = u.IORING_RECVSEND_FIXED_BUF | (u.IORING_SEND_ZC_REPORT_USAGE if report_usage else 0)
    return ring.prep(u.IORING_OP_SEND_ZC, fd, addr, length, user_data=user_data, ioprio=ioprio,
                     op_flags=msg_flags, buf_index=buf_index)


def prep_recv_zc(ring: Ring, fd: int, ifq_idx: int, user_data: int = 0, length: int = 0) -> int:
    """Multishot RECV_ZC into a registered zcrx interface queue (needs a CQE32 ring)."""
    return ring.prep(u.IORING_OP_RECV_ZC, fd, 0, length, user_data=user_data,
                     ioprio=u.IORING_RECV_MULTISHOT, file_index=ifq_idx)


def prep_cancel(ring: Ring, target_user_data: int, user_data: int = 0) -> int:
    return ring.prep(u.IORING_OP_ASYNC_CANCEL, -1, target_user_data, user_data=user_data)
