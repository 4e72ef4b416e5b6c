"""NIC control plane: generic netlink, ethtool, netdev and ntuple.

- ``nlattr``: the netlink attribute/message codec (sans I/O, table driven);
- ``genl``: ``GenlSocket`` (family resolution, do/dump, extack errors, timeouts);
- ``device``: ``Device``, one interface's sockets in its namespace and error translation;
- ``ethtool``, ``netdev``, ``ntuple``: the families and the ioctl, one function per operation;
- ``info``: ``show`` and ``nic_env`` (metadata for a result's JSON env);
- ``doctor``: the readiness checklist; ``setup``: ``NicConfig``, ``apply``, ``restore``;
  ``steps``: the setup steps, each an apply and an undo;
- ``arrival``: which set-up RX queue delivered a connection (``arrived_on``).

Sockets open in the namespace ``--netns`` names through ``zcnet.netns``.
"""
