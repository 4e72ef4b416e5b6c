"""Snapshots of what a test may leak: namespaces, veth links, netdevsim devices, processes (VMs
included), fds and memory mappings (io_uring rings and buffer rings, dma-buf and memfd maps, and
anonymous areas).

Some facts about reading leaked memory from /proc/self/maps:

- An area is an anonymous private mapping; the kernel merges neighbouring anonymous mappings
  with equal flags, so a leak shows as address ranges that were not mapped before, not
  necessarily as one new line. We count the new bytes.
- Other anonymous memory comes and goes for reasons that are no leak: thread stacks (cached by
  glibc after join; a PROT_NONE guard page right below them), glibc's per-thread malloc heaps
  (64 MiB aligned reservations, the unused part PROT_NONE) and CPython's 1 MiB object arenas.
  The first two are recognised by their shape, and a live thread's stack also by holding its
  stack pointer (/proc/self/task/*/syscall; its guard may be merged away); the arenas are
  counted by the interpreter (sys._debugmallocstats) and subtracted.
- What is left, new bytes less bytes unmapped since (memory that moved is no leak), is allowed
  to grow by less than 2 MiB (malloc's own mmapped chunks and the arena count's lag churn by up
  to 1 MiB here), so a leaked area of 2 MiB or more is caught, a smaller one may not be; one
  freed during the test can hide one as large.
"""

from __future__ import annotations

import gc
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from zcnet.lab.names import parse_lab, parse_netns, pid_alive
from zcnet.lab.netdevsim import owner_of

ANON_SLACK = 2 << 20
MALLOC_HEAP_ALIGN = 64 << 20  # glibc HEAP_MAX_SIZE on 64-bit
NETDEVSIM = Path("/sys/bus/netdevsim/devices")
# Namespaces and links tests make outside a Lab name their owner too: zctx<pid>, a link's peer
# zctx<pid>p (tests/tx/test_tx_senders.py: ifb; test_experiments_runner.py: a bare veth).
_TEST_NETNS = re.compile(r"zctx([1-9][0-9]*)")
_NSIM_DIR = re.compile(r"netdevsim([0-9]+)")
_VM_TMP = re.compile(r"/zcnet-vm-([1-9][0-9]*)-")  # zcnet.vm.runner's temp dir


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _descends_from_us(pid: int) -> bool:
    me = os.getpid()
    while pid > 1:
        if pid == me:
            return True
        pid = _ppid(pid)
    return False


def _could_be_ours(name: str) -> bool:
    """Only what this test could have made is counted, so another program's lab never fails a
    test. A name no zcnet test gives is never ours. zcnet's names carry their owner: a
    ``zc<pid>x<n>`` lab, or ``zctx<pid>`` as tests name what they make outside a lab."""
    if (m := _TEST_NETNS.fullmatch(name)) is not None:
        return _owner_may_be_us(int(m[1]))
    lab = parse_netns(name) or parse_lab(name)
    return lab is not None and _owner_may_be_us(lab.owner)


def _owner_may_be_us(owner: int | None) -> bool:
    """A persistent lab (``zcup<n>``, owner not recorded) and one whose owner died (nobody else
    will remove it) may be ours; one owned by a live process other than us and our descendants
    is theirs."""
    return owner is None or not pid_alive(owner) or _descends_from_us(owner)


def _netns() -> frozenset[str]:
    d = Path("/run/netns")
    names = (p.name for p in d.iterdir()) if d.is_dir() else ()
    return frozenset(n for n in names if _could_be_ours(n))


def _veths() -> frozenset[str]:
    """veth links in our namespace that a test could have made (see _could_be_ours); a lab's
    ends live inside its namespaces, so these are what a test made outside a lab, or a lab's
    end that outlived its namespace."""
    out = set()
    for dev in Path("/sys/class/net").iterdir():
        try:
            kind = (dev / "uevent").read_text()
        except OSError:
            continue
        # veth has no 'DEVTYPE' line; its driver link names it.
        drv = dev / "device" / "driver"
        if "DEVTYPE" not in kind and not drv.exists() and (dev / "iflink").exists():
            iflink = (dev / "iflink").read_text().strip()
            ifindex = (dev / "ifindex").read_text().strip()
            if iflink != ifindex and dev.name != "lo" and _could_be_ours(
                    dev.name.removesuffix("p")):
                out.add(dev.name)
    return frozenset(out)


def _netdevsim() -> frozenset[str]:
    """netdevsim devices a test could have made: zcnet's IDs encode the owning lab
    (zcnet.lab.netdevsim.owner_of); devices with other IDs are another program's."""
    if not NETDEVSIM.is_dir():
        return frozenset()
    out = set()
    for p in NETDEVSIM.iterdir():
        m = _NSIM_DIR.fullmatch(p.name)
        owner = owner_of(int(m[1])) if m is not None else None
        if owner is not None and _owner_may_be_us(owner.pid):
            out.add(p.name)
    return frozenset(out)


def _vm_could_be_ours(pid: int) -> bool:
    """zcnet's VM runner boots from a temp dir named for its process (zcnet-vm-<pid>-...): a QEMU
    with none in its command line is another program's; one whose runner is a live process
    other than us and our descendants is another run's."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    m = _VM_TMP.search(argv)
    return m is not None and _owner_may_be_us(int(m[1]))


def _processes() -> tuple[frozenset[str], frozenset[str]]:
    """(our descendants at any depth, orphaned QEMU processes we could have started), each as
    'pid:comm'.

    A QEMU whose parent died is reparented to init: it is then nobody's child, but it is still
    a VM somebody started and left running."""
    parent: dict[int, int] = {}
    comm: dict[int, str] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        head, tail = stat.rsplit(")", 1)
        pid = int(p.name)
        parent[pid] = int(tail.split()[1])
        comm[pid] = head.split("(", 1)[1]
    me = os.getpid()
    ours = set()
    for pid in parent:
        q, seen = parent[pid], 0
        while q > 1 and seen < 64:
            if q == me:
                ours.add(pid)
                break
            q, seen = parent.get(q, 0), seen + 1
    orphans = {pid for pid, pp in parent.items()
               if pp == 1 and comm[pid].startswith("qemu") and _vm_could_be_ours(pid)}
    return (frozenset(f"{p}:{comm[p]}" for p in ours),
            frozenset(f"{p}:{comm[p]}" for p in orphans))


def _fds() -> frozenset[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            continue
    return frozenset(out)


def _mapping_kind(path: str) -> str | None:
    if "io_uring" in path:
        return "io_uring"
    if "dmabuf" in path:
        return "dma-buf"
    if path.startswith("/memfd:"):
        return "memfd"
    return None


def _stack_pointers() -> list[int]:
    """The stack pointer of each of our threads that sits in a system call."""
    sps = []
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "syscall").read_text().split()
        except OSError:
            continue
        if len(fields) >= 3 and fields[0] != "running":
            sps.append(int(fields[-2], 16))
    return sps


def _maps(text: str, stack_pointers: list[int]) -> tuple[tuple[str, ...],
                                                         tuple[tuple[int, int], ...]]:
    """(kernel-object mappings as 'kind path range', anonymous read-write ranges that are
    neither thread stacks nor malloc heaps) of /proc/self/maps ``text``."""
    rows = []
    for line in text.splitlines():
        f = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        rows.append((lo, hi, f[1], f[5] if len(f) > 5 else ""))
    special = []
    anon = []
    heap_end = 0  # end of the malloc heap reservation we are inside, if any
    for i, (lo, hi, perms, path) in enumerate(rows):
        if path:
            if (kind := _mapping_kind(path)) is not None:
                special.append(f"{kind} {path} {lo:x}-{hi:x}")
            continue
        if lo % MALLOC_HEAP_ALIGN == 0 and perms.startswith("rw"):
            # A malloc heap: read-write from the aligned start, the rest of the reservation
            # PROT_NONE; parts may be split by madvise/mprotect, so skip the whole block.
            heap_end = lo + MALLOC_HEAP_ALIGN
        if lo < heap_end or not perms.startswith("rw"):
            continue
        prev = rows[i - 1] if i else None
        if prev is not None and prev[1] == lo and prev[2].startswith("---") and not prev[3]:
            continue  # a thread stack above its guard page
        if any(lo <= sp < hi for sp in stack_pointers):
            continue  # a live thread's stack
        anon.append((lo, hi))
    return tuple(special), tuple(anon)


_ARENAS = re.compile(rb"# arenas allocated current\s*=\s*(\d+)")


def _py_arenas() -> int:
    """CPython's live object arenas (1 MiB anonymous mappings each), from _debugmallocstats,
    which writes to the C-level stderr."""
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        m = _ARENAS.search(f.read())
    return int(m.group(1)) if m else 0


ARENA_SIZE = 1 << 20


def _new_bytes(after: tuple[tuple[int, int], ...], before: tuple[tuple[int, int], ...]) -> int:
    """Bytes of ``after`` ranges not covered by any ``before`` range."""
    total = 0
    for lo, hi in after:
        n = hi - lo
        for blo, bhi in before:
            n -= max(0, min(hi, bhi) - max(lo, blo))
        total += n
    return total


@dataclass(frozen=True)
class Snapshot:
    netns: frozenset[str]
    veths: frozenset[str]
    netdevsim: frozenset[str]
    processes: frozenset[str]
    orphan_vms: frozenset[str]
    fds: frozenset[str]
    special_maps: tuple[str, ...]
    anon: tuple[tuple[int, int], ...]
    arenas: int

    @classmethod
    def take(cls) -> Snapshot:
        # Garbage in reference cycles (a test's frame kept by its exception's traceback) is no
        # leak, the collector frees it; collecting first also keeps it out of "before".
        gc.collect()
        procs, vms = _processes()
        netns, veths, nsim, fds = _netns(), _veths(), _netdevsim(), _fds()
        # Arenas, then the maps at once: arenas made by the work above are in both counts,
        # and nothing between the two reads makes new ones.
        arenas = _py_arenas()
        special, anon = _maps(Path("/proc/self/maps").read_text(), _stack_pointers())
        return cls(netns, veths, nsim, procs, vms, fds, special, anon, arenas)

    @property
    def uring_maps(self) -> int:
        return sum(s.startswith("io_uring ") for s in self.special_maps)

    def anon_growth(self, before: Snapshot) -> int:
        """Anonymous bytes mapped now and not before, less those unmapped since (so memory that
        merely moved, an arena freed here and one made there, nets out), less what CPython's
        own arenas grew by."""
        return (_new_bytes(self.anon, before.anon) - _new_bytes(before.anon, self.anon)
                - (self.arenas - before.arenas) * ARENA_SIZE)

    def leaked_since(self, before: Snapshot) -> list[str]:
        problems = []
        for what, now, then in (
                ("network namespaces", self.netns, before.netns),
                ("veth links", self.veths, before.veths),
                ("netdevsim devices", self.netdevsim, before.netdevsim),
                ("processes (children and their children)", self.processes, before.processes),
                ("orphaned VMs (qemu)", self.orphan_vms, before.orphan_vms),
                ("file descriptors", self.fds, before.fds)):
            if extra := now - then:
                problems.append(f"{what} left: {sorted(extra)}")
        kinds: dict[str, int] = {}
        for s in self.special_maps:
            kinds[s.split()[0]] = kinds.get(s.split()[0], 0) + 1
        for s in before.special_maps:
            kinds[s.split()[0]] = kinds.get(s.split()[0], 0) - 1
        for kind, n in sorted(kinds.items()):
            if n > 0:
                new = sorted(set(self.special_maps) - set(before.special_maps))
                which = [s for s in new if s.startswith(kind)]
                problems.append(f"{kind} mappings left: {n} ({which})")
        if (grown := self.anon_growth(before)) >= ANON_SLACK:
            new = [f"{lo:x}-{hi:x}" for lo, hi in self.anon if (lo, hi) not in before.anon]
            problems.append(f"anonymous mappings left: {grown} bytes more than before "
                            f"(new or grown: {new[:6]})")
        return problems
