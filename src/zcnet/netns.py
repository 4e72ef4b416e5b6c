"""Entering named network namespaces (the ``ip netns`` kind, bind-mounted under /run/netns).

Below ``lab`` and ``nic`` so that the lab, the NIC control plane (``--netns``), the benchmark
and the VM runner share one way in. Creating namespaces is ``zcnet.lab``'s job.

Some facts about setns(2) and network namespaces:

- ``setns(fd, CLONE_NEWNET)`` moves only the *calling thread*. A freshly started, single-threaded
  worker that calls it is therefore wholly inside the namespace; a busy multi-threaded process
  is not, which is why ``in_netns`` saves and restores the thread's own namespace.
- A socket belongs to the namespace its creating thread was in, for its whole life. So it is
  enough to be inside the namespace while the socket (or netlink socket) is opened.
- /proc/thread-self/ns/net names the calling thread's namespace; /proc/self names the thread
  group leader's, which is the wrong one once a non-main thread has moved.
- Python 3.12 added os.setns; on 3.10/3.11 the libc wrapper is called through ctypes.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Literal, TypeAlias, overload

from zcnet.caps import has_caps
from zcnet.errors import ZcnetError
from zcnet.uapi.capability import CAP_NET_ADMIN, CAP_SYS_ADMIN
from zcnet.uapi.sched import CLONE_NEWNET

NETNS_RUN_DIR = Path("/run/netns")


def can_create_netns() -> bool:
    """True if this process may create namespaces and veths: NET_ADMIN for links and
    addresses, SYS_ADMIN for the namespace's bind mount under /run/netns."""
    return has_caps(CAP_NET_ADMIN, CAP_SYS_ADMIN)


class NeedRoot(ZcnetError):
    """The process lacks the capabilities namespaces and veths need."""

    def __init__(self) -> None:
        super().__init__("network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)",
                         privilege_hint())


def privilege_hint() -> str:
    """What to do when namespaces are refused: root that lacks the capabilities (a container)
    needs them granted; anyone else needs root. The command adds its own way around the lab."""
    if os.geteuid() == 0:
        return ("this root lacks CAP_NET_ADMIN/CAP_SYS_ADMIN or a security policy refused it "
                "(a container?): grant them")
    return "run as root"


class NoSuchNetns(ZcnetError):
    """No namespace of that name under /run/netns (never made, or already removed)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no network namespace named {name!r}",
                         "`zcnet lab status` lists the labs, `ip netns list` all namespaces")


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)
    try:
        if setns is not None:
            setns(fd, CLONE_NEWNET)
        elif _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    except PermissionError:
        raise NeedRoot from None


def netns_path(name: str) -> Path:
    # A file name under /run/netns: NAME_MAX (255) bytes at most.
    if not name or "/" in name or name in (".", "..") or len(os.fsencode(name)) > 255:
        raise ZcnetError(f"bad network namespace name {name[:64]!r}",
                         "`ip netns list` shows the names")
    return NETNS_RUN_DIR / name


def netns_exists(name: str) -> bool:
    """True if /run/netns/NAME is a mounted namespace (not just a leftover empty file)."""
    path = netns_path(name)
    try:
        # A bound namespace lives on nsfs, so its device differs from the directory's.
        return path.stat().st_dev != NETNS_RUN_DIR.stat().st_dev
    except FileNotFoundError:
        return False


def list_netns() -> list[str]:
    try:
        return sorted(p.name for p in NETNS_RUN_DIR.iterdir())
    except FileNotFoundError:
        return []


def _open_netns(name: str) -> int:
    try:
        return os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NoSuchNetns(name) from None


def enter_netns(name: str) -> None:
    """Move the calling thread into namespace NAME for good.

    Meant for a freshly started worker process (one thread, so the whole process moves)."""
    fd = _open_netns(name)
    try:
        _setns(fd)
    finally:
        os.close(fd)


@contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Run the block with this thread inside namespace NAME (None: where it already is); other
    threads are unaffected, but threads started inside the block inherit NAME (clone copies the
    namespaces)."""
    if name is None:
        yield
        return
    with ExitStack() as stack:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        stack.callback(os.close, home)
        target = _open_netns(name)
        try:
            _setns(target)
        finally:
            os.close(target)
        # If going home fails the thread is stranded in the wrong namespace; let it raise.
        stack.callback(_setns, home)
        yield


# A child's stdin, stdout or stderr, as subprocess.Popen takes it: PIPE, DEVNULL, a file, or
# None (inherited).
Stream: TypeAlias = "int | IO[str] | IO[bytes] | None"


@overload
def netns_popen(name: str, argv: Sequence[str], *, text: Literal[True], stdin: Stream = None,
                stdout: Stream = None, stderr: Stream = None, bufsize: int = -1,
                env: Mapping[str, str] | None = None) -> subprocess.Popen[str]: ...


@overload
def netns_popen(name: str, argv: Sequence[str], *, text: Literal[False] = False,
                stdin: Stream = None, stdout: Stream = None, stderr: Stream = None,
                bufsize: int = -1,
                env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]: ...


def netns_popen(name: str, argv: Sequence[str], *, text: bool = False, stdin: Stream = None,
                stdout: Stream = None, stderr: Stream = None, bufsize: int = -1,
                env: Mapping[str, str] | None = None
                ) -> subprocess.Popen[str] | subprocess.Popen[bytes]:
    """Start ARGV inside namespace NAME and return its Popen (same pid as the command); the
    streams, ``text``, ``bufsize`` and ``env`` as subprocess.Popen takes them.

    ``ip netns exec`` execs the command in place after setns and also remounts /sys, so tools
    that read /sys/class/net see the namespace's interfaces."""
    if not netns_exists(name):
        raise NoSuchNetns(name)
    try:
        return subprocess.Popen(["ip", "netns", "exec", name, *argv], stdin=stdin,
                                stdout=stdout, stderr=stderr, text=text, bufsize=bufsize,
                                env=env)
    except FileNotFoundError:
        raise ZcnetError("the `ip` command is missing",
                         "install iproute2 (apt-get install iproute2)") from None
