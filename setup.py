"""Build hook for the optional compiled accelerators (zcnet.uring._accel, the ring's hot path;
zcnet.rx.zc._rxaccel, the receive core's per-chunk twins; zcnet.aio._loopaccel, the event
loop's shared-ring pass); everything else about the package is in pyproject.toml.

The extensions are optional: with no C compiler (or a failing build) the install still succeeds
and zcnet runs its pure-Python path. ZCNET_PURE=1 selects the pure path even when they are built.
"""

from setuptools import Extension, setup

# Shared by all: zcnet/_cqe.h (reading CQEs), _bufring.h (a provided-buffer ring's entries),
# _ints.h (int sequences into C memory), _slots.h (__slots__ members in place) and _members.h
# (the members a Python class hands its compiled twin, as descriptors). ``depends``
# rebuilds them when a header changes and puts it in the sdist; the include dir finds them.
_SHARED = {"include_dirs": ["src/zcnet"], "optional": True}
_HEADERS = ["src/zcnet/_cqe.h", "src/zcnet/_bufring.h", "src/zcnet/_ints.h", "src/zcnet/_slots.h",
            "src/zcnet/_members.h"]
_RX = "src/zcnet/rx/zc/_c/"
_LOOP = "src/zcnet/aio/_c/"

setup(ext_modules=[Extension("zcnet.uring._accel",
                             ["src/zcnet/uring/_accel.c", "src/zcnet/uring/_accel_bufring.c"],
                             depends=[*_HEADERS, "src/zcnet/uring/_accel.h"], **_SHARED),
                   Extension("zcnet.rx.zc._rxaccel",
                             [_RX + f for f in ("module.c", "chunks.c", "chunkiter.c", "ints.c",
                                                "softround.c")],
                             depends=[*_HEADERS, _RX + "rxaccel.h"], **_SHARED),
                   Extension("zcnet.aio._loopaccel",
                             [_LOOP + f for f in ("module.c", "router.c", "round.c", "anext.c",
                                                  "copysend.c")],
                             depends=[*_HEADERS, _LOOP + "loopaccel.h"], **_SHARED)])
