"""linux/mman.h and asm-generic/mman-common.h (x86 values): memory mapping flags Python's
mmap module does not export. Names as in the headers."""

from __future__ import annotations

PROT_READ = 0x1
PROT_WRITE = 0x2
PROT_NONE = 0x0

MAP_SHARED = 0x01
MAP_PRIVATE = 0x02
MAP_FIXED = 0x10
MAP_ANONYMOUS = 0x20
MAP_NORESERVE = 0x4000
MAP_POPULATE = 0x008000
MAP_HUGETLB = 0x040000

# asm-generic/hugetlb_encode.h: the page size's log2 in the flag bits above MAP_HUGE_SHIFT.
MAP_HUGE_SHIFT = 26
MAP_HUGE_2MB = 21 << MAP_HUGE_SHIFT
