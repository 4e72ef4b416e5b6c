"""linux/dma-buf.h: CPU access brackets for a mapped dma-buf. Names as in the header."""

from __future__ import annotations

import ctypes

DMA_BUF_SYNC_READ = 1 << 0
DMA_BUF_SYNC_WRITE = 2 << 0
DMA_BUF_SYNC_RW = DMA_BUF_SYNC_READ | DMA_BUF_SYNC_WRITE
DMA_BUF_SYNC_START = 0 << 2
DMA_BUF_SYNC_END = 1 << 2


class dma_buf_sync(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64),)


# _IOW('b', 0, struct dma_buf_sync)
DMA_BUF_IOCTL_SYNC = (1 << 30) | (ctypes.sizeof(dma_buf_sync) << 16) | (ord("b") << 8) | 0
