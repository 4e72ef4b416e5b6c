"""NIC control plane: generic netlink, ethtool, netdev and ntuple."""
