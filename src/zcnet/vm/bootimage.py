"""An uncompressed ``vmlinux`` with a PVH entry point, taken out of a ``bzImage``.

Some facts: a ``bzImage`` decompresses itself before the kernel's clock starts, and under TCG
that takes seconds (Debian's are zstd, ~64 MB unpacked). QEMU boots an ELF ``vmlinux`` that
carries the Xen PVH entry note (``XEN_ELFNOTE_PHYS32_ENTRY``, Debian sets ``CONFIG_PVH``)
directly, skipping both the decompressor and the real-mode setup. The payload is found by its
compression magic, as the kernel's ``scripts/extract-vmlinux`` does; trailing bytes after the
compressed stream are expected. Anything unexpected means "no vmlinux": the bzImage still boots.
"""

from __future__ import annotations

import lzma
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

XEN_ELFNOTE_PHYS32_ENTRY = 18
_PT_NOTE = 4


def _zstd(data: bytes) -> bytes:
    tool = shutil.which("zstd")
    if tool is None:
        return b""
    # Exit status 1 is the trailing data after the frame; the output is complete.
    return subprocess.run([tool, "-dcq"], input=data, capture_output=True, check=False).stdout


def _xz(data: bytes) -> bytes:
    try:
        return lzma.LZMADecompressor().decompress(data)
    except lzma.LZMAError:
        return b""


def _gzip(data: bytes) -> bytes:
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)
    except zlib.error:
        return b""


_FORMATS = ((b"\x28\xb5\x2f\xfd", _zstd), (b"\xfd7zXZ\x00", _xz), (b"\x1f\x8b\x08", _gzip))


def has_pvh_entry(elf: bytes) -> bool:
    """True if ``elf`` is a 64-bit ELF with a Xen PHYS32_ENTRY note."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        return False
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        ptype, _, offset, _, _, filesz = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if ptype != _PT_NOTE:
            continue
        pos, end = offset, offset + filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def extract_vmlinux(bzimage: Path, out: Path) -> bool:
    """Write the PVH-bootable vmlinux inside ``bzimage`` to ``out``; False if there is none."""
    data = bzimage.read_bytes()
    for magic, decompress in _FORMATS:
        start = data.find(magic)
        while start != -1:
            elf = decompress(data[start:])
            if has_pvh_entry(elf):
                out.write_bytes(elf)
                return True
            start = data.find(magic, start + 1)
    return False
