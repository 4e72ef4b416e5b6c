"""The leak checker itself: it sees a leaked area and a leaked fd, and does not mistake the
interpreter's and the allocator's own churn for a leak."""

from __future__ import annotations

import mmap
import os
import threading
import time
from pathlib import Path

import pytest

from leaks import Snapshot


def test_a_leaked_4mib_anonymous_mapping_is_caught():
    before = Snapshot.take()
    m = mmap.mmap(-1, 4 << 20, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m[::4096] = b"\1" * (len(m) // 4096)  # touched, like an area the kernel filled
        problems = Snapshot.take().leaked_since(before)
        assert any(p.startswith("anonymous mappings left") for p in problems), problems
    finally:
        m.close()
    assert Snapshot.take().leaked_since(before) == []


def test_a_leaked_area_next_to_another_mapping_is_caught():
    """Neighbouring anonymous mappings merge into one line of /proc/self/maps: the new bytes
    still count."""
    first = mmap.mmap(-1, 2 << 20, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        before = Snapshot.take()
        second = mmap.mmap(-1, 2 << 20, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            problems = Snapshot.take().leaked_since(before)
            assert any(p.startswith("anonymous mappings left") for p in problems), problems
        finally:
            second.close()
    finally:
        first.close()


def test_a_leaked_fd_and_a_leaked_memfd_mapping_are_caught():
    before = Snapshot.take()
    fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert any(p.startswith("file descriptors left") and "/dev/null" in p
                   for p in Snapshot.take().leaked_since(before))
    finally:
        os.close(fd)
    memfd = os.memfd_create("leak-check", os.MFD_CLOEXEC)
    os.ftruncate(memfd, 8192)
    m = mmap.mmap(memfd, 8192)
    os.close(memfd)
    try:
        # Python's mmap keeps its own duplicate of the fd, so both show.
        problems = Snapshot.take().leaked_since(before)
        assert any(p.startswith("memfd mappings left: 1") for p in problems), problems
    finally:
        m.close()
    assert Snapshot.take().leaked_since(before) == []


def test_a_left_child_process_is_caught():
    import subprocess
    import sys

    before = Snapshot.take()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        problems = Snapshot.take().leaked_since(before)
        assert any(p_.startswith("processes") and str(p.pid) in p_ for p_ in problems), problems
    finally:
        p.kill()
        p.wait()
    assert Snapshot.take().leaked_since(before) == []


def test_thread_stacks_and_python_objects_are_not_leaks():
    """glibc caches joined threads' 8 MiB stacks, and CPython keeps arenas for live objects:
    neither is a leak of ours."""
    before = Snapshot.take()
    threads = [threading.Thread(target=lambda: [bytearray(1 << 16) for _ in range(100)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept: tuple | None = None
    for i in range(200_000):  # many MiB of small objects (arenas), no big buffer
        kept = (kept, [i] * 10)
    assert Snapshot.take().leaked_since(before) == []
    del kept


@pytest.mark.root
def test_namespaces_of_other_live_processes_are_theirs():
    """Another test run's namespace (named for its live owner) is not our leak; ours is."""
    import subprocess

    before = Snapshot.take()
    theirs, ours = "zctx1", f"zctx{os.getpid()}"  # pid 1 is alive and not our descendant
    for ns in (theirs, ours):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        problems = Snapshot.take().leaked_since(before)
        assert problems == [f"network namespaces left: ['{ours}']"]
    finally:
        for ns in (theirs, ours):
            subprocess.run(["ip", "netns", "del", ns], check=True)


@pytest.mark.root
def test_only_links_and_namespaces_a_test_could_have_made_count():
    """Another program's namespace (a name no zcnet test gives) and another live run's veth are
    not our leak; a veth named for us is."""
    import subprocess

    before = Snapshot.take()
    made: list[list[str]] = []
    try:
        for cmd in (["ip", "netns", "add", "otherprog0"],
                    ["ip", "link", "add", "zctx1", "type", "veth", "peer", "name", "zctx1p"],
                    ["ip", "link", "add", f"zctx{os.getpid()}", "type", "veth", "peer", "name",
                     f"zctx{os.getpid()}p"]):
            subprocess.run(cmd, check=True)
            made.append(cmd)
        problems = Snapshot.take().leaked_since(before)
        ours = f"zctx{os.getpid()}"
        assert problems == [f"veth links left: {sorted([ours, ours + 'p'])}"]
    finally:
        for cmd in made:
            subprocess.run([*cmd[:2], "del", cmd[3]], check=True)
    assert Snapshot.take().leaked_since(before) == []


def test_netdevsim_devices_count_by_the_lab_their_id_names():
    """A device of a live foreign run's lab is theirs; of our lab, of a dead owner's lab or of a
    persistent lab it may be ours; an ID zcnet never gives is another program's."""
    from leaks import _owner_may_be_us
    from zcnet.lab.names import owned, persistent
    from zcnet.lab.netdevsim import device_id, owner_of

    def may_be_ours(dev_id: int) -> bool:
        owner = owner_of(dev_id)
        return owner is not None and _owner_may_be_us(owner.pid)

    assert not may_be_ours(device_id(owned(1, 3), "a"))
    assert may_be_ours(device_id(owned(os.getpid(), 3), "b"))
    assert may_be_ours(device_id(persistent(2), "a"))
    assert not may_be_ours(7)


def test_an_orphaned_vm_counts_only_when_zcnet_could_have_started_it_for_us():
    """zcnet's runner names its temp dir for its process; the check reads QEMU's command line."""
    import subprocess
    import sys

    from leaks import _vm_could_be_ours

    for marker, ours in (("/tmp/zcnet-vm-1-abc/initramfs.cpio", False),
                         (f"/tmp/zcnet-vm-{os.getpid()}-abc/initramfs.cpio", True),
                         ("/tmp/other/initramfs.cpio", False)):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
        try:
            # Until the child has exec'd, its command line is still ours.
            cmdline = Path(f"/proc/{p.pid}/cmdline")
            deadline = time.monotonic() + 10
            while marker.encode() not in cmdline.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _vm_could_be_ours(p.pid) is ours, marker
        finally:
            p.kill()
            p.wait()
