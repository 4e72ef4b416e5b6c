"""Run zcnet under a kernel the host does not run: Debian kernels >= 7.2 booted in QEMU.

Why plain QEMU and not virtme-ng (both were measured on this project's machine, TCG, 2 vCPUs):
QEMU with a small busybox initramfs reached the first output in ~4.4 s and ``import numpy`` in
~2 s, because the host's ``/`` can be mounted over 9p with ``cache=loose``; virtme-ng 1.42 took
~7.6 s to first output, ~5 s for ``import numpy`` (9p without ``cache=loose``), and needed
``systemd-udevd`` on the host to get output and exit status back. The initramfs here is ~100
lines we control, and needs only ``qemu-system-x86`` and ``busybox-static`` from apt.

Layers: ``sources`` (which archive), ``archive`` (private apt, resolve, download, unpack),
``kernels`` (the cache), ``caps`` (what a kernel offers), ``accel`` (KVM probe), ``initramfs``
(the guest's early userspace), ``runner`` (``VM``, ``run_in_vm``). This package knows nothing
of the benchmark; it sits beside ``zcnet.lab``.
"""

from zcnet.vm.runner import IN_VM_ENV, VM, RunResult, run_in_vm

__all__ = ["IN_VM_ENV", "VM", "RunResult", "run_in_vm"]
