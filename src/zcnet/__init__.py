"""zcnet: zero-copy networking for Python on Linux, and the benchmark that proves it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("zcnet")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+src"

__all__ = ["__version__"]
