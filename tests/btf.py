"""A reader for `bpftool btf dump` raw output: struct member offsets/sizes and enum values."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
_HEAD = re.compile(r"^\[(\d+)\] (\w+) '([^']*)'(.*)$")
_MEMBER = re.compile(r"^\t'([^']*)' type_id=(\d+)(?: bits_offset=(\d+))?")
_ENUMVAL = re.compile(r"^\t'([^']*)' val=(-?\d+)")
_KV = re.compile(r"(\w+)=(\S+)")


@dataclass
class BtfType:
    kind: str
    name: str
    attrs: dict[str, str]
    members: list[tuple[str, int, int]] = field(default_factory=list)  # name, type_id, bit off


class Btf:
    def __init__(self, text: str) -> None:
        self.types: dict[int, BtfType] = {}
        self.enums: dict[str, int] = {}
        self.by_name: dict[tuple[str, str], int] = {}
        cur: BtfType | None = None
        for line in text.splitlines():
            if m := _HEAD.match(line):
                tid, kind, name, rest = int(m[1]), m[2], m[3], m[4]
                cur = BtfType(kind, name, dict(_KV.findall(rest)))
                self.types[tid] = cur
                self.by_name.setdefault((kind, name), tid)
            elif cur is not None and (m := _MEMBER.match(line)):
                cur.members.append((m[1], int(m[2]), int(m[3] or 0)))
            elif cur is not None and cur.kind in ("ENUM", "ENUM64") and (m := _ENUMVAL.match(line)):
                self.enums[m[1]] = int(m[2])

    @classmethod
    def load(cls, vmlinux: Path = VMLINUX) -> Btf | None:
        """The BTF of the running kernel, or of a ``vmlinux`` ELF file; None without bpftool
        or the file."""
        bpftool = shutil.which("bpftool")
        if not vmlinux.exists() or bpftool is None:
            return None
        out = subprocess.run([bpftool, "btf", "dump", "file", str(vmlinux)],
                             capture_output=True, text=True, check=True).stdout
        return cls(out)

    def size(self, tid: int) -> int:
        t = self.types[tid]
        if t.kind in ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"):
            return self.size(int(t.attrs["type_id"]))
        if t.kind == "ARRAY":
            return self.size(int(t.attrs["type_id"])) * int(t.attrs["nr_elems"])
        if t.kind == "PTR":
            return 8
        return int(t.attrs["size"])

    def layout(self, struct: str) -> tuple[int, dict[str, tuple[int, int]]]:
        """Size of ``struct`` and {member: (byte offset, byte size)}, anonymous unions flattened."""
        tid = self.by_name[("STRUCT", struct)]
        out: dict[str, tuple[int, int]] = {}

        def walk(t: int, base: int) -> None:
            for name, mtid, bits in self.types[t].members:
                off = base + bits // 8
                if name == "(anon)":
                    walk(mtid, off)
                else:
                    out.setdefault(name, (off, self.size(mtid)))

        walk(tid, 0)
        return self.size(tid), out
