"""Re-export of ``zcnet.netns``, the namespace helper below ``lab`` and ``nic``, for the callers
that import it from here: bench/client.py, bench/remote.py, bench/txbench.py, cli/__init__.py,
lab/netdevsim.py, benchmarks/txbench_modes.py and the tests of bench, vm, nsim and zc."""

from __future__ import annotations

from zcnet.netns import (
    NETNS_RUN_DIR,
    NeedRoot,
    NoSuchNetns,
    can_create_netns,
    enter_netns,
    in_netns,
    list_netns,
    netns_exists,
    netns_path,
    netns_popen,
    privilege_hint,
)

__all__ = [
    "NETNS_RUN_DIR",
    "NeedRoot",
    "NoSuchNetns",
    "can_create_netns",
    "enter_netns",
    "in_netns",
    "list_netns",
    "netns_exists",
    "netns_path",
    "netns_popen",
    "privilege_hint",
]
