"""Reading a result file back (``zcnet compare``, ``zcnet run --report``), whatever the file is.

A report is often run on a file someone handed over, so the file is treated as hostile: it is
read only if it is a regular file (a FIFO would block forever, ``/dev/zero`` never ends), read
through a non-blocking descriptor (``/proc/kmsg`` is a "regular" file that blocks), at most
``MAX_BYTES`` of it (memory stays bounded however large it is), decoded as UTF-8 only (a
UTF-16 file or a latin-1 one says so instead of a traceback), and its nesting is bounded
(json's recursion would otherwise end in RecursionError, or pass and break later in a report).
Each problem is one ``UsageError`` naming the file and what to give instead.
"""

from __future__ import annotations

import codecs
import json
import os
import stat
from typing import Any

from zcnet.errors import UsageError
from zcnet.report.cells import check_figures

MAX_BYTES = 64 << 20   # a run of thousands of cells repeated is a few MiB
MAX_DEPTH = 32         # a result nests about 6 deep
FIX = "give a file written by --json/--out"

# Byte-order marks of the encodings a result file is not in.
_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
         (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


def read_bytes(path: str) -> bytes:
    """The bytes of regular file ``path``, at most ``MAX_BYTES``; never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", FIX) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is {_kind(st.st_mode)}, not a result file", FIX)
        if st.st_size > MAX_BYTES:
            raise UsageError(f"{path} is {st.st_size >> 20} MiB, more than a result file "
                             f"holds (at most {MAX_BYTES >> 20} MiB)", FIX)
        chunks: list[bytes] = []
        got = 0
        while got <= MAX_BYTES:  # a file whose size lies (/proc, /sys) stops here too
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                raise UsageError(f"{path} has nothing to read now (it would block)", FIX) \
                    from None
            except OSError as exc:
                raise UsageError(f"cannot read {path}: {exc.strerror or exc}", FIX) from None
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > MAX_BYTES:
        raise UsageError(f"{path} is larger than a result file (more than "
                         f"{MAX_BYTES >> 20} MiB)", FIX)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def decode(path: str, data: bytes) -> str:
    """UTF-8 text (a UTF-8 BOM is allowed); any other encoding is named in the error."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise UsageError(f"{path} is {name} text; result files are UTF-8",
                             f"{FIX}, or convert it: iconv -f {name} -t UTF-8")
    if b"\0" in data[:4096]:
        raise UsageError(f"{path} is binary or UTF-16/32 without a byte-order mark, not a "
                         "result file", FIX)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start})", f"{FIX}, or convert it to UTF-8") from None


def depth_exceeds(doc: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``doc`` nests deeper than ``limit`` (walked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return False


def _nesting_error(path: str) -> UsageError:
    return UsageError(f"{path} nests more than {MAX_DEPTH} levels deep; a result file "
                      "does not", FIX)


def parse(path: str, text: str) -> Any:
    try:
        doc = json.loads(text)
    except RecursionError:
        raise _nesting_error(path) from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not JSON: {exc}", FIX) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise UsageError(f"{path} is not a result file: {exc}", FIX) from None
    if depth_exceeds(doc):
        raise _nesting_error(path)
    return doc


# Top-level keys a report reads, and the type each must have.
_TOP = (("env", dict), ("experiment", dict), ("report", dict), ("kind", str),
        ("complete", bool), ("warnings", list))


def load_result(path: str) -> dict[str, Any]:
    """A zcnet result envelope from ``path``, checked: one-line errors for anything else."""
    doc = parse(path, decode(path, read_bytes(path)))
    if not isinstance(doc, dict) or doc.get("tool") != "zcnet" \
            or not isinstance(doc.get("results"), list):
        raise UsageError(f"{path} is not a zcnet result file", FIX)
    for key, kind in _TOP:
        if key in doc and not isinstance(doc[key], kind):
            raise UsageError(f"{path}: '{key}' is not {'text' if kind is str else kind.__name__}"
                             f" but {doc[key]!r}"[:300],
                             f"{FIX} (not edited by hand)")
    if not all(isinstance(w, str) for w in doc.get("warnings", [])):
        raise UsageError(f"{path}: 'warnings' must be a list of texts",
                         f"{FIX} (not edited by hand)")
    check_figures(doc, path)
    return doc
