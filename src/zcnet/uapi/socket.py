"""Socket-level ABI: asm-generic/socket.h, linux/socket.h, linux/uio.h (devmem) and the few
option numbers the Python ``socket`` module does not export; the message structs a ctypes
sendmsg/sendmmsg passes. Names as in the headers."""

from __future__ import annotations

import ctypes

# asm-generic/socket.h
SOL_SOCKET = 1
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
SO_INCOMING_CPU = 49
SO_INCOMING_NAPI_ID = 56
SO_ZEROCOPY = 60
SO_BUSY_POLL = 46
SO_PREFER_BUSY_POLL = 69
SO_BUSY_POLL_BUDGET = 70
SO_DEVMEM_LINEAR = 78
SCM_DEVMEM_LINEAR = SO_DEVMEM_LINEAR
SO_DEVMEM_DMABUF = 79
SCM_DEVMEM_DMABUF = SO_DEVMEM_DMABUF
SO_DEVMEM_DONTNEED = 80

# linux/socket.h (msg flags)
MSG_DONTWAIT = 0x40
MSG_WAITALL = 0x100
MSG_ERRQUEUE = 0x2000
MSG_NOSIGNAL = 0x4000
MSG_SOCK_DEVMEM = 0x2000000
MSG_ZEROCOPY = 0x4000000

# linux/tcp.h
SOL_TCP = 6
TCP_NODELAY = 1
TCP_MAXSEG = 2
TCP_INFO = 11
TCP_QUICKACK = 12
TCP_ZEROCOPY_RECEIVE = 35


class dmabuf_cmsg(ctypes.Structure):
    """linux/uio.h: payload of SCM_DEVMEM_DMABUF / SCM_DEVMEM_LINEAR."""

    _fields_ = (
        ("frag_offset", ctypes.c_uint64),
        ("frag_size", ctypes.c_uint32),
        ("frag_token", ctypes.c_uint32),
        ("dmabuf_id", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
    )


class dmabuf_token(ctypes.Structure):
    """linux/uio.h: one range of tokens handed back with SO_DEVMEM_DONTNEED."""

    _fields_ = (("token_start", ctypes.c_uint32), ("token_count", ctypes.c_uint32))


class iovec(ctypes.Structure):
    """linux/uio.h. For a devmem send (SCM_DEVMEM_DMABUF) ``iov_base`` is an offset into the
    dma-buf, not an address."""

    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


class user_msghdr(ctypes.Structure):
    """linux/socket.h: the ``struct msghdr`` of sendmsg(2) (user_msghdr in the kernel)."""

    _fields_ = (
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_int),
        ("msg_iov", ctypes.POINTER(iovec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_uint),
    )


class mmsghdr(ctypes.Structure):
    """linux/socket.h: one message of sendmmsg/recvmmsg."""

    _fields_ = (("msg_hdr", user_msghdr), ("msg_len", ctypes.c_uint))


class cmsghdr(ctypes.Structure):
    """linux/socket.h: a control message's header; its data follows, aligned to size_t."""

    _fields_ = (
        ("cmsg_len", ctypes.c_size_t),  # header and data, without the trailing padding
        ("cmsg_level", ctypes.c_int),
        ("cmsg_type", ctypes.c_int),
    )
