"""The guest's initramfs: static busybox, the kernel's 9p/overlay/veth modules and ``/init``.

``/init`` loads the modules, mounts the host's ``/`` read-only over 9p as the new root (with
``cache=loose``: the host files do not change while the guest runs, and Python imports need the
page cache to be fast), puts fresh ``proc``/``sys``/``dev`` and tmpfs ``/run`` and ``/dev/shm``
over it (``/run`` fresh so that the host's ``/run/netns`` is not seen), throwaway overlays over
``/etc``, ``/var``, ``/root`` and ``/tmp`` (programs can write there, the host sees nothing, and
the host's files there stay visible: a pytest rootdir under /tmp works), mounts the read-write
share at its host path, then runs the command script from the control share inside a chroot.
It writes the command's exit status to the control share and powers off. The archive is written
here in the ``newc`` cpio format, uncompressed (the kernel unpacks it faster than it could
inflate it under TCG).
"""

from __future__ import annotations

import shutil
import stat
import struct
from collections.abc import Iterable
from pathlib import Path

from zcnet.errors import ZcnetError

# Mount tags of the 9p shares; /init and the QEMU command line must agree on them.
TAG_HOST = "host"
TAG_WORK = "work"
TAG_CTL = "ctl"
CTL_DIR = "/run/zcnet-vm"      # where the control share appears inside the guest
CMD_SCRIPT = "cmd.sh"
WORK_PATH = "work_path"         # control-share file naming the read-write share's guest path
RC_FILE = "rc"
STARTED_FILE = "started"        # written just before the command runs
GUEST_TTY = "/dev/hvc0"         # the virtio console that carries the command's output

_P9 = "trans=virtio,version=9p2000.L,msize=524288"

INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say() {{ echo "zcnet-vm: $*" > {GUEST_TTY}; echo "zcnet-vm: $*" > /dev/console; }}
die() {{ say "$*"; echo "init: $*" > /ctl/error 2>/dev/null; sync; poweroff -f; }}
stty -F {GUEST_TTY} -opost 2>/dev/null
for m in $(cat /modules.order); do insmod /modules/$m || die "cannot load module $m"; done
mount -t 9p -o {_P9},cache=none {TAG_CTL} /ctl || die "cannot mount the control share"
mount -t 9p -o {_P9},cache=loose,ro {TAG_HOST} /newroot || die "cannot mount the host's /"
R=/newroot
mount -t tmpfs -o mode=0755 tmpfs $R/run || die "no tmpfs on /run"
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm
mount -t bpf bpf $R/sys/fs/bpf 2>/dev/null
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup 2>/dev/null
mount -t tmpfs tmpfs /rw
for d in etc var root tmp; do
  [ -d $R/$d ] || continue
  mkdir -p /rw/$d/up /rw/$d/work
  mount -t overlay overlay -o lowerdir=$R/$d,upperdir=/rw/$d/up,workdir=/rw/$d/work $R/$d \\
    || die "cannot overlay /$d"
done
mkdir -p $R{CTL_DIR}
mount --bind /ctl $R{CTL_DIR}
W=$(cat /ctl/{WORK_PATH})   # quoted below: a host path may hold spaces
if [ -n "$W" ]; then
  [ -d "$R$W" ] || mkdir -p "$R$W" || die "no directory $W to mount the share on"
  mount -t 9p -o {_P9},cache=loose {TAG_WORK} "$R$W" || die "cannot mount the share at $W"
fi
# The kernel brings no interface up; loopback tests and servers need lo, as on the host.
ip link set lo up || die "cannot bring lo up"
: > /ctl/{STARTED_FILE}  # the host: a crash before this one was the boot's, not the command's
chroot $R /bin/sh {CTL_DIR}/{CMD_SCRIPT} < /dev/null > {GUEST_TTY} 2>&1
echo $? > /ctl/{RC_FILE}
sync
poweroff -f
"""


class MissingBusybox(ZcnetError):
    def __init__(self, detail: str) -> None:
        super().__init__(f"no static busybox for the guest: {detail}",
                         "apt-get install busybox-static")


def find_busybox() -> Path:
    path = shutil.which("busybox") or ("/bin/busybox" if Path("/bin/busybox").exists() else None)
    if path is None:
        raise MissingBusybox("busybox not found")
    if not _is_static(Path(path)):
        raise MissingBusybox(f"{path} is dynamically linked")
    return Path(path)


def _is_static(path: Path) -> bool:
    """True if the ELF file has no program interpreter (PT_INTERP)."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return False
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        fh.seek(phoff)
        table = fh.read(phentsize * phnum)
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != 3 for i in range(phnum))


def _entry(name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0),
           ino: int = 0) -> bytes:
    fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0)
    header = b"070701" + b"".join(f"{v:08x}".encode() for v in fields)
    out = header + name.encode() + b"\0"
    out += b"\0" * (-len(out) % 4)
    return out + data + b"\0" * (-len(data) % 4)


def newc(entries: Iterable[tuple[str, int, bytes, tuple[int, int]]]) -> bytes:
    """A newc cpio archive of (name, mode, data, (rdevmajor, rdevminor)) entries."""
    parts = [_entry(name, mode, data, rdev, ino)
             for ino, (name, mode, data, rdev) in enumerate(entries, start=1)]
    parts.append(_entry("TRAILER!!!", 0))
    return b"".join(parts)


def build(modules: list[Path], busybox: Path, out: Path) -> None:
    d, x, r = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o755, stat.S_IFREG | 0o644
    entries: list[tuple[str, int, bytes, tuple[int, int]]] = [
        (name, d, b"", (0, 0)) for name in
        ("bin", "dev", "proc", "sys", "newroot", "ctl", "rw", "modules")]
    entries += [
        ("dev/console", stat.S_IFCHR | 0o600, b"", (5, 1)),
        ("bin/busybox", x, busybox.read_bytes(), (0, 0)),
        ("init", x, INIT.encode(), (0, 0)),
        ("modules.order", r, "".join(f"{m.name}\n" for m in modules).encode(), (0, 0)),
    ]
    entries += [(f"modules/{m.name}", r, m.read_bytes(), (0, 0)) for m in modules]
    out.write_bytes(newc(entries))
