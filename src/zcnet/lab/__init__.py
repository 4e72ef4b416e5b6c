"""Network-namespace topologies the tool creates, uses and always tears down."""
