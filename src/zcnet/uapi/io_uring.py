"""linux/io_uring.h (and linux/io_uring/*.h): constants and struct layouts, names as in the header.

Structs are ctypes definitions so their sizes and offsets can be checked against the running
kernel's BTF (tests/uapi/test_uapi_btf.py). Unions in the header are flattened to their first
member; ``SQE_ALIASES`` names the other members that share an offset, so the checker covers
them too. The hot path does not use these classes: it writes numpy views at the offsets they define.
"""

from __future__ import annotations

import ctypes

u8, u16, u32, u64, s32 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, \
    ctypes.c_int32

# --- syscalls (x86_64 / arm64 share the io_uring numbers) -------------------------------------
__NR_io_uring_setup = 425
__NR_io_uring_enter = 426
__NR_io_uring_register = 427

# --- io_uring_setup flags --------------------------------------------------------------------
IORING_SETUP_IOPOLL = 1 << 0
IORING_SETUP_SQPOLL = 1 << 1
IORING_SETUP_SQ_AFF = 1 << 2
IORING_SETUP_CQSIZE = 1 << 3
IORING_SETUP_CLAMP = 1 << 4
IORING_SETUP_ATTACH_WQ = 1 << 5
IORING_SETUP_R_DISABLED = 1 << 6
IORING_SETUP_SUBMIT_ALL = 1 << 7
IORING_SETUP_COOP_TASKRUN = 1 << 8
IORING_SETUP_TASKRUN_FLAG = 1 << 9
IORING_SETUP_SQE128 = 1 << 10
IORING_SETUP_CQE32 = 1 << 11
IORING_SETUP_SINGLE_ISSUER = 1 << 12
IORING_SETUP_DEFER_TASKRUN = 1 << 13
IORING_SETUP_NO_MMAP = 1 << 14
IORING_SETUP_REGISTERED_FD_ONLY = 1 << 15
IORING_SETUP_NO_SQARRAY = 1 << 16
# CQ entries of 16 and 32 bytes in one ring (6.18): a 32-byte one has IORING_CQE_F_32 and
# takes two slots; one that would straddle the wrap is preceded by an IORING_CQE_F_SKIP pad.
IORING_SETUP_CQE_MIXED = 1 << 18

# --- opcodes (enum io_uring_op) --------------------------------------------------------------
IORING_OP_NOP = 0
IORING_OP_READV = 1
IORING_OP_WRITEV = 2
IORING_OP_READ_FIXED = 4
IORING_OP_WRITE_FIXED = 5
IORING_OP_POLL_ADD = 6
IORING_OP_SENDMSG = 9
IORING_OP_RECVMSG = 10
IORING_OP_TIMEOUT = 11
IORING_OP_ACCEPT = 13
IORING_OP_ASYNC_CANCEL = 14
IORING_OP_CONNECT = 16
IORING_OP_CLOSE = 19
IORING_OP_READ = 22
IORING_OP_WRITE = 23
IORING_OP_SEND = 26
IORING_OP_RECV = 27
IORING_OP_PROVIDE_BUFFERS = 31
IORING_OP_SHUTDOWN = 34
IORING_OP_SEND_ZC = 47
IORING_OP_SENDMSG_ZC = 48
IORING_OP_READ_MULTISHOT = 49
IORING_OP_RECV_ZC = 58
IORING_OP_EPOLL_WAIT = 59
IORING_OP_PIPE = 62
IORING_OP_LAST = 63

# --- sqe->flags --------------------------------------------------------------------------------
IOSQE_FIXED_FILE = 1 << 0
IOSQE_IO_DRAIN = 1 << 1
IOSQE_IO_LINK = 1 << 2
IOSQE_IO_HARDLINK = 1 << 3
IOSQE_ASYNC = 1 << 4
IOSQE_BUFFER_SELECT = 1 << 5
IOSQE_CQE_SKIP_SUCCESS = 1 << 6

# --- send/recv flags, carried in sqe->ioprio ---------------------------------------------------
IORING_RECVSEND_POLL_FIRST = 1 << 0
IORING_RECV_MULTISHOT = 1 << 1
IORING_RECVSEND_FIXED_BUF = 1 << 2
IORING_SEND_ZC_REPORT_USAGE = 1 << 3
IORING_RECVSEND_BUNDLE = 1 << 4

# cqe->res of a SEND_ZC notification when IORING_SEND_ZC_REPORT_USAGE was set
IORING_NOTIF_USAGE_ZC_COPIED = 1 << 31

# sqe->nop_flags: the NOP posts a 32-byte CQE (on a CQE_MIXED ring; 6.18)
IORING_NOP_CQE32 = 1 << 5

# --- cqe->flags ----------------------------------------------------------------------------------
IORING_CQE_F_BUFFER = 1 << 0
IORING_CQE_F_MORE = 1 << 1
IORING_CQE_F_SOCK_NONEMPTY = 1 << 2
IORING_CQE_F_NOTIF = 1 << 3
IORING_CQE_F_BUF_MORE = 1 << 4
IORING_CQE_F_SKIP = 1 << 5
IORING_CQE_F_32 = 1 << 15
IORING_CQE_BUFFER_SHIFT = 16

# --- io_uring_enter flags --------------------------------------------------------------------
IORING_ENTER_GETEVENTS = 1 << 0
IORING_ENTER_SQ_WAKEUP = 1 << 1
IORING_ENTER_SQ_WAIT = 1 << 2
IORING_ENTER_EXT_ARG = 1 << 3
IORING_ENTER_REGISTERED_RING = 1 << 4

# --- sq_ring->flags / cq_ring->flags ----------------------------------------------------------
IORING_SQ_NEED_WAKEUP = 1 << 0
IORING_SQ_CQ_OVERFLOW = 1 << 1
IORING_SQ_TASKRUN = 1 << 2

# --- features ------------------------------------------------------------------------------------
IORING_FEAT_SINGLE_MMAP = 1 << 0
IORING_FEAT_NODROP = 1 << 1
IORING_FEAT_SUBMIT_STABLE = 1 << 2
IORING_FEAT_FAST_POLL = 1 << 5
IORING_FEAT_EXT_ARG = 1 << 8
IORING_FEAT_NATIVE_WORKERS = 1 << 9
IORING_FEAT_CQE_SKIP = 1 << 11
IORING_FEAT_REG_REG_RING = 1 << 13
IORING_FEAT_RECVSEND_BUNDLE = 1 << 14

# --- mmap offsets ------------------------------------------------------------------------------
IORING_OFF_SQ_RING = 0
IORING_OFF_CQ_RING = 0x8000000
IORING_OFF_SQES = 0x10000000
IORING_OFF_PBUF_RING = 0x80000000
IORING_OFF_PBUF_SHIFT = 16

# --- io_uring_register opcodes (enum io_uring_register_op) ----------------------------------
IORING_REGISTER_BUFFERS = 0
IORING_UNREGISTER_BUFFERS = 1
IORING_REGISTER_FILES = 2
IORING_UNREGISTER_FILES = 3
IORING_REGISTER_EVENTFD = 4
IORING_UNREGISTER_EVENTFD = 5
IORING_REGISTER_PROBE = 8
IORING_REGISTER_ENABLE_RINGS = 12
IORING_REGISTER_RING_FDS = 20
IORING_UNREGISTER_RING_FDS = 21
IORING_REGISTER_PBUF_RING = 22
IORING_UNREGISTER_PBUF_RING = 23
IORING_REGISTER_PBUF_STATUS = 26
IORING_REGISTER_NAPI = 27
IORING_UNREGISTER_NAPI = 28
IORING_REGISTER_ZCRX_IFQ = 32
IORING_REGISTER_RESIZE_RINGS = 33
IORING_REGISTER_MEM_REGION = 34
IORING_REGISTER_QUERY = 35      # "blind": fd -1, nr_args 0; linux/io_uring/query.h
IORING_REGISTER_ZCRX_CTRL = 36  # struct zcrx_ctrl, nr_args 0

IO_URING_OP_SUPPORTED = 1 << 0

# provided buffer ring registration flags
IOU_PBUF_RING_MMAP = 1
IOU_PBUF_RING_INC = 2

# --- memory regions and zcrx -------------------------------------------------------------------
IORING_MEM_REGION_TYPE_USER = 1
IORING_ZCRX_AREA_DMABUF = 1
IORING_ZCRX_AREA_SHIFT = 48
IORING_ZCRX_AREA_MASK = ~((1 << IORING_ZCRX_AREA_SHIFT) - 1) & (2**64 - 1)

# enum zcrx_reg_flags (io_uring_zcrx_ifq_reg.flags). NODEV: no net device; the kernel copies
# every byte into the area, and refill entries may not be consumed until ZCRX_CTRL_FLUSH_RQ.
ZCRX_REG_IMPORT = 1
ZCRX_REG_NODEV = 2

# enum zcrx_features (io_uring_query_zcrx.features)
ZCRX_FEATURE_RX_PAGE_SIZE = 1 << 0  # io_uring_zcrx_ifq_reg.rx_buf_len is honoured
ZCRX_FEATURE_EVENT = 1 << 1         # io_uring_zcrx_ifq_reg.event_desc: events and stats

# enum zcrx_event_type (zcrx_event_desc.type_mask bits, zcrx_ctrl_arm_event.event_type)
ZCRX_EVENT_ALLOC_FAIL = 0
ZCRX_EVENT_COPY = 1

# enum zcrx_event_desc_flags. STATS: stats_offset locates a struct zcrx_stats in the refill
# region, which the kernel keeps counting its copy fallback in (frags it copied; not the
# payload it copies out of an skb's linear part).
ZCRX_EVENT_DESC_FLAG_STATS = 1 << 0

# enum zcrx_ctrl_op (zcrx_ctrl.op, IORING_REGISTER_ZCRX_CTRL)
ZCRX_CTRL_FLUSH_RQ = 0
ZCRX_CTRL_EXPORT = 1
ZCRX_CTRL_ARM_EVENT = 2
ZCRX_CTRL_ADD_AREA = 3  # 7.3: another area for the ifq; the kernel writes its rq_area_token

# linux/io_uring/query.h: io_uring_query_hdr.query_op
IO_URING_QUERY_OPCODES = 0
IO_URING_QUERY_ZCRX = 1
IO_URING_QUERY_SCQ = 2
IO_URING_QUERY_ZCRX_EVENT = 3


# --- structs -------------------------------------------------------------------------------------
class io_sqring_offsets(ctypes.Structure):
    _fields_ = (
        ("head", u32), ("tail", u32), ("ring_mask", u32), ("ring_entries", u32),
        ("flags", u32), ("dropped", u32), ("array", u32), ("resv1", u32), ("user_addr", u64),
    )


class io_cqring_offsets(ctypes.Structure):
    _fields_ = (
        ("head", u32), ("tail", u32), ("ring_mask", u32), ("ring_entries", u32),
        ("overflow", u32), ("cqes", u32), ("flags", u32), ("resv1", u32), ("user_addr", u64),
    )


class io_uring_params(ctypes.Structure):
    _fields_ = (
        ("sq_entries", u32), ("cq_entries", u32), ("flags", u32), ("sq_thread_cpu", u32),
        ("sq_thread_idle", u32), ("features", u32), ("wq_fd", u32), ("resv", u32 * 3),
        ("sq_off", io_sqring_offsets), ("cq_off", io_cqring_offsets),
    )


class io_uring_sqe(ctypes.Structure):
    _fields_ = (
        ("opcode", u8), ("flags", u8), ("ioprio", u16), ("fd", s32),
        ("off", u64),            # union: addr2, cmd_op
        ("addr", u64),           # union: splice_off_in, level/optname
        ("len", u32),
        ("rw_flags", u32),       # union: msg_flags, nop_flags, ...
        ("user_data", u64),
        ("buf_index", u16),      # union: buf_group
        ("personality", u16),
        ("splice_fd_in", s32),   # union: file_index, zcrx_ifq_idx, optlen, addr_len
        ("addr3", u64),          # union: attr_ptr, optval
        ("__pad2", u64 * 1),
    )


# Other members of the header's unions: (name, offset, size).
SQE_ALIASES: tuple[tuple[str, int, int], ...] = (
    ("addr2", 8, 8), ("msg_flags", 28, 4), ("nop_flags", 28, 4), ("buf_group", 40, 2),
    ("file_index", 44, 4), ("zcrx_ifq_idx", 44, 4), ("optlen", 44, 4), ("addr_len", 44, 2),
)


class io_uring_cqe(ctypes.Structure):
    _fields_ = (("user_data", u64), ("res", s32), ("flags", u32))


class io_uring_probe_op(ctypes.Structure):
    _fields_ = (("op", u8), ("resv", u8), ("flags", u16), ("resv2", u32))


class io_uring_probe(ctypes.Structure):
    _fields_ = (("last_op", u8), ("ops_len", u8), ("resv", u16), ("resv2", u32 * 3))


class io_uring_buf(ctypes.Structure):
    # In a buf_ring the u16 `resv` of entry 0 is the ring's tail.
    _fields_ = (("addr", u64), ("len", u32), ("bid", u16), ("resv", u16))


class io_uring_buf_reg(ctypes.Structure):
    _fields_ = (
        ("ring_addr", u64), ("ring_entries", u32), ("bgid", u16), ("flags", u16),
        ("min_left", u32), ("resv", u32 * 5),
    )


class io_uring_buf_status(ctypes.Structure):  # IORING_REGISTER_PBUF_STATUS (Linux 6.8)
    _fields_ = (("buf_group", u32), ("head", u32), ("resv", u32 * 8))


class io_uring_getevents_arg(ctypes.Structure):
    _fields_ = (("sigmask", u64), ("sigmask_sz", u32), ("min_wait_usec", u32), ("ts", u64))


class io_uring_region_desc(ctypes.Structure):
    _fields_ = (
        ("user_addr", u64), ("size", u64), ("flags", u32), ("id", u32), ("mmap_offset", u64),
        ("__resv", u64 * 4),
    )


class io_uring_zcrx_rqe(ctypes.Structure):
    _fields_ = (("off", u64), ("len", u32), ("__pad", u32))


class io_uring_zcrx_cqe(ctypes.Structure):
    _fields_ = (("off", u64), ("__pad", u64))


class io_uring_zcrx_offsets(ctypes.Structure):
    _fields_ = (("head", u32), ("tail", u32), ("rqes", u32), ("__resv2", u32), ("__resv", u64 * 2))


class io_uring_zcrx_area_reg(ctypes.Structure):
    _fields_ = (
        ("addr", u64), ("len", u64), ("rq_area_token", u64), ("flags", u32), ("dmabuf_fd", u32),
        ("__resv2", u64 * 2),
    )


class io_uring_zcrx_ifq_reg(ctypes.Structure):
    # 7.x: rx_buf_len took __resv2 (the kernel writes back the buffer size it chose) and
    # event_desc took __resv[0]; older kernels require both zero, which 0 here is.
    _fields_ = (
        ("if_idx", u32), ("if_rxq", u32), ("rq_entries", u32), ("flags", u32),
        ("area_ptr", u64), ("region_ptr", u64), ("offsets", io_uring_zcrx_offsets),
        ("zcrx_id", u32), ("rx_buf_len", u32), ("event_desc", u64), ("__resv", u64 * 2),
    )


class zcrx_ctrl_flush_rq(ctypes.Structure):
    _fields_ = (("__resv", u64 * 6),)


class zcrx_ctrl_export(ctypes.Structure):
    _fields_ = (("zcrx_fd", u32), ("__resv1", u32 * 11))


class zcrx_ctrl_arm_event(ctypes.Structure):
    _fields_ = (("event_type", u32), ("__resv", u32 * 11))


class zcrx_ctrl_add_area(ctypes.Structure):
    _fields_ = (("area_ptr", u64), ("__resv", u64 * 5))  # -> struct io_uring_zcrx_area_reg


class zcrx_stats(ctypes.Structure):
    _fields_ = (("copy_count", u64), ("copy_bytes", u64))


class zcrx_event_desc(ctypes.Structure):  # io_uring_zcrx_ifq_reg.event_desc points here
    _fields_ = (("user_data", u64), ("type_mask", u32), ("flags", u32),
                ("stats_offset", u64), ("__resv2", u64 * 9))


class zcrx_ctrl(ctypes.Structure):
    _fields_ = (
        ("zcrx_id", u32), ("op", u32), ("__resv", u64 * 2),
        ("zc_flush", zcrx_ctrl_flush_rq),  # union: zc_export, zc_arm_event, zc_area
    )


# Other members of zcrx_ctrl's union: (name, offset, size).
ZCRX_CTRL_ALIASES: tuple[tuple[str, int, int], ...] = (("zc_export", 24, 48),
                                                        ("zc_arm_event", 24, 48),
                                                        ("zc_area", 24, 48))


class io_uring_query_hdr(ctypes.Structure):
    _fields_ = (
        ("next_entry", u64), ("query_data", u64), ("query_op", u32), ("size", u32),
        ("result", s32), ("__resv", u32 * 3),
    )


class io_uring_query_zcrx(ctypes.Structure):
    _fields_ = (
        ("register_flags", u64), ("area_flags", u64), ("nr_ctrl_opcodes", u32),
        ("features", u32), ("rq_hdr_size", u32), ("rq_hdr_alignment", u32), ("__resv2", u64),
    )


class io_uring_query_zcrx_event(ctypes.Structure):  # IO_URING_QUERY_ZCRX_EVENT
    _fields_ = (
        ("event_flags", u32), ("stats_size", u32), ("stats_off_alignment", u32),
        ("__resv1", u32), ("__resv2", u64 * 4),
    )


# Every struct above, for the BTF checker.
STRUCTS: tuple[type[ctypes.Structure], ...] = (
    io_sqring_offsets, io_cqring_offsets, io_uring_params, io_uring_sqe, io_uring_cqe,
    io_uring_probe_op, io_uring_probe, io_uring_buf, io_uring_buf_reg, io_uring_getevents_arg,
    io_uring_region_desc, io_uring_zcrx_rqe, io_uring_zcrx_cqe, io_uring_zcrx_offsets,
    io_uring_zcrx_area_reg, io_uring_zcrx_ifq_reg, zcrx_ctrl_flush_rq, zcrx_ctrl_export,
    zcrx_ctrl_arm_event, zcrx_ctrl_add_area, zcrx_stats, zcrx_event_desc, zcrx_ctrl,
    io_uring_query_hdr,
    io_uring_query_zcrx, io_uring_query_zcrx_event,
)

# Layout the host's 6.18 lacks, first in the 7.x headers (7.2): {struct: fields}, and enum
# values. The BTF check skips these on older kernels and requires them on 7.x (in the VM).
NEWER_FIELDS: dict[str, tuple[str, ...]] = {
    "io_uring_zcrx_ifq_reg": ("rx_buf_len", "event_desc", "__resv"),
    "zcrx_ctrl_flush_rq": ("__resv",), "zcrx_ctrl_export": ("zcrx_fd", "__resv1"),
    "zcrx_ctrl_arm_event": ("event_type", "__resv"), "zcrx_stats": ("copy_count", "copy_bytes"),
    "zcrx_ctrl_add_area": ("area_ptr", "__resv"),
    "zcrx_event_desc": ("user_data", "type_mask", "flags", "stats_offset", "__resv2"),
    "zcrx_ctrl": ("zcrx_id", "op", "__resv", "zc_flush"),
    "io_uring_query_zcrx": ("register_flags", "area_flags", "nr_ctrl_opcodes", "features",
                            "rq_hdr_size", "rq_hdr_alignment", "__resv2"),
    "io_uring_query_zcrx_event": ("event_flags", "stats_size", "stats_off_alignment",
                                  "__resv1", "__resv2"),
}
NEWER_ENUMS: tuple[str, ...] = (
    "IORING_REGISTER_ZCRX_CTRL", "ZCRX_REG_IMPORT", "ZCRX_REG_NODEV",
    "ZCRX_FEATURE_RX_PAGE_SIZE", "ZCRX_FEATURE_EVENT", "ZCRX_CTRL_FLUSH_RQ", "ZCRX_CTRL_EXPORT",
    "ZCRX_CTRL_ARM_EVENT", "ZCRX_CTRL_ADD_AREA", "IO_URING_QUERY_ZCRX", "IO_URING_QUERY_SCQ",
    "IO_URING_QUERY_ZCRX_EVENT", "ZCRX_EVENT_ALLOC_FAIL", "ZCRX_EVENT_COPY",
    "ZCRX_EVENT_DESC_FLAG_STATS",
)

# Opcode names for messages ("RECV_ZC not supported by this kernel").
OP_NAMES: dict[int, str] = {
    v: k.removeprefix("IORING_OP_") for k, v in dict(globals()).items()
    if k.startswith("IORING_OP_") and k != "IORING_OP_LAST"
}
