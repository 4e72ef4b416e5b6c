"""Receive data paths: engines and zero-copy providers with their buffer lifetimes."""
