"""Kernel ABI only: constants and struct layouts, named exactly as in the uapi headers. No logic."""
