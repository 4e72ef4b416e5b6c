"""Build hook for the optional compiled accelerators (zcnet.uring._accel, the ring's hot path;
zcnet.aio._loopaccel, the event loop's shared-ring pass); everything else about the package is
in pyproject.toml.

The extensions are optional: with no C compiler (or a failing build) the install still succeeds
and zcnet runs its pure-Python path. ZCNET_PURE=1 selects the pure path even when they are built.
"""

from setuptools import Extension, setup

# Shared by both: zcnet/_cqe.h (reading CQEs) and zcnet/_bufring.h (a provided-buffer ring's
# entries). ``depends`` rebuilds them when a header changes and puts it in the sdist; the
# include dir finds them.
_SHARED = {"include_dirs": ["src/zcnet"], "optional": True}
_HEADERS = ["src/zcnet/_cqe.h", "src/zcnet/_bufring.h"]

setup(ext_modules=[Extension("zcnet.uring._accel",
                             ["src/zcnet/uring/_accel.c", "src/zcnet/uring/_accel_rx.c"],
                             depends=[*_HEADERS, "src/zcnet/uring/_accel.h"], **_SHARED),
                   Extension("zcnet.aio._loopaccel", ["src/zcnet/aio/_loopaccel.c"],
                             depends=_HEADERS, **_SHARED)])
