"""Send data paths: copy, zero-copy and batched senders."""
