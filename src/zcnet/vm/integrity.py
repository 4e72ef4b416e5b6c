"""Whether the files of a cache entry are whole: the sizes and SHA-256 digests written with the
entry, and the file formats' own statements of their size.

Some facts that shape it:

- An entry appears by an atomic rename, so a half-written one is never seen; damage comes
  later (a full disk, a copy that stopped, an edit, another program). QEMU boots a truncated
  kernel image anyway and the guest dies in ways that point nowhere near the file.
- A digest catches any change but needs a record from when the entry was whole; entries written
  before the record existed have none. So the formats are checked too: a bzImage's setup header
  says how long its setup code and payload are (``setup_sects``, ``syssize``), an ELF header
  where its program and section tables are, and each table where its segments and sections
  are. A file shorter than that is truncated; one without the magic is not that kind of file.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

# The setup header of a bzImage (Documentation/arch/x86/boot.rst).
_SETUP_SECTS, _SYSSIZE, _HDRS_AT, _HDRS = 0x1F1, 0x1F4, 0x202, b"HdrS"
_ELF64_LE = b"\x7fELF\x02\x01"
_PHDR = struct.Struct("<8xQ16xQ16x")     # Elf64_Phdr: p_offset, p_filesz
_SHDR = struct.Struct("<4xI16xQQ24x")    # Elf64_Shdr: sh_type, sh_offset, sh_size
_SHT_NOBITS = 8                          # a section that takes no room in the file (.bss)
_CHUNK = 1 << 20


def digest(path: Path) -> tuple[int, str]:
    """(size, SHA-256 hex digest) of the file ``path``, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def manifest(root: Path, names: list[str]) -> dict[str, list[int | str]]:
    """``{name: [size, sha256]}`` of the files ``names`` under ``root``: the record a later
    ``manifest_problem`` checks against."""
    return {name: list(digest(root / name)) for name in names}


def manifest_problem(root: Path, record: dict[str, list[int | str]]) -> str | None:
    """The first file under ``root`` that is missing, or differs from ``record``; or None."""
    for name, (size, sha) in record.items():
        path = root / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size} bytes, {size} when the entry was made"
        if digest(path)[1] != sha:
            return f"{name} changed since the entry was made (SHA-256 differs)"
    return None


def bzimage_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole x86 bzImage, or None."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(_HDRS_AT + 4)
    if len(head) < _HDRS_AT + 4 or head[_HDRS_AT:] != _HDRS:
        return f"{path.name} is not a kernel image (no bzImage setup header)"
    setup_sects = head[_SETUP_SECTS] or 4    # 0 means 4, for old boot loaders
    syssize, = struct.unpack_from("<I", head, _SYSSIZE)
    need = (setup_sects + 1) * 512 + syssize * 16
    if size < need:
        return f"{path.name} is truncated: {size} bytes, its header says {need}"
    return None


def elf_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole 64-bit little-endian ELF file (a vmlinux, a module), or
    None: the header's tables, and every segment and section in them, lie inside the file."""
    size = path.stat().st_size
    truncated = f"{path.name} is truncated: {size} bytes, its ELF headers say more"
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or not head.startswith(_ELF64_LE):
            return f"{path.name} is not a 64-bit ELF file"
        phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
        if (phnum and (phentsize < _PHDR.size or phoff + phentsize * phnum > size)) or \
                (shnum and (shentsize < _SHDR.size or shoff + shentsize * shnum > size)):
            return truncated
        f.seek(phoff)
        phdrs = f.read(phentsize * phnum)
        f.seek(shoff)
        shdrs = f.read(shentsize * shnum)
    for i in range(phnum):
        offset, filesz = _PHDR.unpack_from(phdrs, i * phentsize)
        if offset + filesz > size:
            return truncated
    for i in range(shnum):
        kind, offset, length = _SHDR.unpack_from(shdrs, i * shentsize)
        if kind != _SHT_NOBITS and offset + length > size:
            return truncated
    return None
