"""What a cached kernel offers zcnet, read from its config and inferred from its version.

Nothing here boots the kernel: ``source`` says where each answer comes from. ``config`` means the
option in the kernel's own config file; ``version`` means the uapi first seen in the 7.2 headers
(``ZCRX_REG_NODEV``, ``rx_buf_len`` with ``ZCRX_FEATURE_RX_PAGE_SIZE``) and assumed present from
7.2 on. Whether a device can do zero-copy is never known from the kernel alone: the VM has no NIC
with a queue API, so device-bound zcrx and devmem cannot run there even when compiled in.
"""

from __future__ import annotations

from dataclasses import dataclass

from zcnet.vm.kernels import Kernel, version_tuple

ZCRX_COPY_MODE_SINCE = (7, 2)


@dataclass(frozen=True)
class Capability:
    name: str
    available: bool
    source: str   # "config" or "version"
    detail: str


def _yes(config: dict[str, str], option: str) -> bool:
    return config.get(option) in ("y", "m")


def capabilities(kernel: Kernel) -> list[Capability]:
    config = kernel.config()
    zcrx = _yes(config, "CONFIG_IO_URING_ZCRX")
    new = version_tuple(kernel.version) >= ZCRX_COPY_MODE_SINCE
    since = ".".join(map(str, ZCRX_COPY_MODE_SINCE))
    return [
        Capability("io_uring zcrx", zcrx, "config", "CONFIG_IO_URING_ZCRX"),
        Capability("zcrx copy mode (ZCRX_REG_NODEV)", zcrx and new, "version",
                   f"uapi from {since} on; the kernel copies into the area, no device needed"),
        Capability("zcrx rx_buf_len", zcrx and new, "version",
                   f"ZCRX_FEATURE_RX_PAGE_SIZE, uapi from {since} on"),
        Capability("devmem TCP", _yes(config, "CONFIG_NET_DEVMEM"), "config",
                   "CONFIG_NET_DEVMEM; needs a NIC with queue API, none in the VM"),
        Capability("udmabuf", _yes(config, "CONFIG_UDMABUF"), "config", "CONFIG_UDMABUF"),
        Capability("netdevsim", _yes(config, "CONFIG_NETDEVSIM"), "config", "CONFIG_NETDEVSIM"),
        Capability("veth", _yes(config, "CONFIG_VETH"), "config", "CONFIG_VETH"),
    ]
