"""Build hook for the optional compiled accelerator (zcnet.uring._accel); everything else about
the package is in pyproject.toml.

The extension is optional: with no C compiler (or a failing build) the install still succeeds and
zcnet runs its pure-Python path. ZCNET_PURE=1 selects the pure path even when it is built.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("zcnet.uring._accel", ["src/zcnet/uring/_accel.c"],
                             optional=True)])
