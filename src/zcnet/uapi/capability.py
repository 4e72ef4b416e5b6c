"""Capability bits: linux/capability.h. Names as in the header."""

from __future__ import annotations

CAP_NET_ADMIN = 12
CAP_IPC_LOCK = 14
CAP_SYS_ADMIN = 21
