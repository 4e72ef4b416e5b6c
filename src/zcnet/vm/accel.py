"""Choosing KVM or TCG by trying KVM, never by the mere presence of /dev/kvm.

Some facts: ``/dev/kvm`` can exist and open while KVM cannot run a guest (a nested setup without
VMX/SVM passed through: QEMU aborts setting an MSR, or the guest crashes early). So the probe
boots a real guest under ``-accel kvm -cpu host``: a one-sector disk whose boot code writes a
magic byte to QEMU's ``isa-debug-exit`` port, which makes QEMU exit with status
``(byte << 1) | 1``. Only that status counts as "KVM works". The answer is cached per process.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

KVM_DEVICE = Path("/dev/kvm")
_MAGIC = 0x31
# mov al, MAGIC; out 0xf4, al; hlt; jmp back to hlt
_BOOT_CODE = bytes([0xB0, _MAGIC, 0xE6, 0xF4, 0xF4, 0xEB, 0xFD])
_PROBE_TIMEOUT = 20.0


@dataclass(frozen=True)
class Accel:
    name: str          # "kvm" or "tcg"
    reason: str        # why this one (what the probe saw)

    @property
    def qemu_args(self) -> list[str]:
        if self.name == "kvm":
            return ["-accel", "kvm", "-cpu", "host"]
        return ["-accel", "tcg", "-cpu", "max"]


def boot_sector() -> bytes:
    return _BOOT_CODE + b"\0" * (510 - len(_BOOT_CODE)) + b"\x55\xaa"


def probe_kvm(qemu: str, device: Path = KVM_DEVICE) -> tuple[bool, str]:
    """(works, what was seen): boot the probe sector under KVM."""
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return False, f"cannot open {device}: {exc.strerror}"
    os.close(fd)
    with tempfile.TemporaryDirectory(prefix=f"zcnet-vm-{os.getpid()}-kvm-") as tmp:
        disk = Path(tmp) / "probe.img"
        disk.write_bytes(boot_sector())
        argv = [qemu, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
                "-accel", "kvm", "-cpu", "host", "-m", "32",
                "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
                "-drive", f"file={disk},format=raw,if=ide"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  timeout=_PROBE_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return False, f"a KVM guest did not finish booting within {_PROBE_TIMEOUT:.0f} s"
    if proc.returncode == (_MAGIC << 1) | 1:
        return True, "a KVM guest booted and ran"
    said = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return False, f"{device} opens but a KVM guest fails: {said}"


@functools.cache
def choose_accel(qemu: str, wanted: str = "auto") -> Accel:
    """``auto``: KVM if the probe boots a guest, else TCG; ``kvm``/``tcg`` are taken as given."""
    if wanted in ("kvm", "tcg"):
        return Accel(wanted, "asked for")
    works, seen = probe_kvm(qemu)
    return Accel("kvm", seen) if works else Accel("tcg", f"KVM unusable ({seen})")
