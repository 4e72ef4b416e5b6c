"""Network-namespace topologies the tool creates, uses and always tears down.

``Lab`` is two fresh namespaces joined by a veth pair (198.18.0.1/30 <-> 198.18.0.2/30, and
2001:db8::1/64 <-> ::2 where IPv6 works); ``zcnet.netns`` enters namespaces; ``zcnet.lab.sweep``
lists labs and removes those whose owner died; ``zcnet.lab.plumbing`` holds the namespace and
link steps both use.
"""

from __future__ import annotations

from zcnet.lab.topology import Lab

__all__ = ["Lab"]
