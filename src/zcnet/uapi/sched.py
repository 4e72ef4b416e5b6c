"""Namespace clone flags: linux/sched.h. Names as in the header."""

from __future__ import annotations

CLONE_NEWNET = 0x40000000
