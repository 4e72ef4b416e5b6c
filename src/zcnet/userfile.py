"""Reading a file a user hands zcnet (a spec, a token, a saved NIC state, a kernel cache entry's
metadata) so that no file can hang it or fill its memory, and every problem is one line naming
the file.

Some facts that shape it:

- Opening a FIFO blocks until a writer comes, and reading ``/dev/zero`` never ends. So the file
  is opened with ``O_NONBLOCK`` and must be a regular file, checked with ``fstat`` on the opened
  descriptor (no swap between the check and the read).
- A regular file can still be huge, or grow while it is read, and procfs files say size 0: at
  most ``limit + 1`` bytes are read, and more than ``limit`` is refused.
- Text must be UTF-8; the error names the line and column of the first byte that is not.
"""

from __future__ import annotations

import codecs
import os
import stat
from collections.abc import Callable
from pathlib import Path

from zcnet.errors import UsageError

# Byte-order marks of encodings that are not UTF-8 (UTF-32 first: its LE mark starts like UTF-16's).
_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
         (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class FileProblem(UsageError):
    """A file that cannot be read as asked; ``errno`` is set when opening it failed."""

    def __init__(self, message: str, hint: str | None = None, errno: int | None = None) -> None:
        super().__init__(message, hint)
        self.errno = errno


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a directory", "a FIFO" ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_bytes(path: str | Path, what: str, *, limit: int, fix: str, nofollow: bool = False,
               check: Callable[[os.stat_result], None] | None = None) -> bytes:
    """The bytes of regular file ``path``, at most ``limit`` of them; ``what`` names it in
    errors ("spec", "token file") and ``fix`` says what to do about it. ``check(st)`` may refuse
    the opened file by its stat (owner, mode) before anything is read. ``nofollow``: a symlink
    is refused (``FileProblem.errno`` ELOOP)."""
    # O_NOCTTY: a terminal given by mistake must not become our controlling terminal.
    flags = (os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
             | (os.O_NOFOLLOW if nofollow else 0))
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise FileProblem(f"cannot read {what} {path}: {exc.strerror}", fix,
                          exc.errno) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileProblem(f"{what} {path} is {kind_of(st.st_mode)}, not a regular file", fix)
        if check is not None:
            check(st)
        if st.st_size > limit:  # refused unread; a size that lies (procfs: 0) stops below
            raise FileProblem(f"{what} {path} is larger than {_size(limit)}", fix)
        data = _read_upto(fd, limit + 1, path, what, fix)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileProblem(f"{what} {path} is larger than {_size(limit)}", fix)
    return data


def _read_upto(fd: int, n: int, path: str | Path, what: str, fix: str) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        try:
            chunk = os.read(fd, min(left, 1 << 20))
        except OSError as exc:   # EAGAIN (/proc/kmsg is "regular" and blocks), EIO
            raise FileProblem(f"cannot read {what} {path}: {exc.strerror}", fix,
                              exc.errno) from None
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_text(path: str | Path, what: str, *, limit: int, fix: str) -> str:
    """``read_bytes`` decoded as UTF-8; a byte that is not names its line and column."""
    return decode(read_bytes(path, what, limit=limit, fix=fix), path, what, fix)


def decode(data: bytes, path: str | Path, what: str, fix: str) -> str:
    """UTF-8 text (a UTF-8 byte-order mark is dropped); another encoding is named, and NUL
    bytes (binary, or UTF-16/32 without a mark) are refused as not text."""
    if bom := next((name for mark, name in _BOMS if data.startswith(mark)), None):
        raise FileProblem(f"{what} {path} is {bom} text, not UTF-8",
                          f"{fix}, or convert it: iconv -f {bom} -t UTF-8")
    if b"\0" in data[:4096]:
        raise FileProblem(f"{what} {path} is binary or UTF-16/32 without a byte-order mark, "
                          "not UTF-8 text", fix)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise FileProblem(f"{what} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                          f"line {line}, column {column})", fix) from None


def file_in_the_way(path: Path) -> Path | None:
    """The first of ``path`` and its parents that exists and is not a directory (a file where
    a directory should be: mkdir then says EEXIST or ENOTDIR), or None. Never raises: a name
    too long or a loop counts as absent."""
    return next((a for a in (path, *path.parents)
                 if os.path.lexists(a) and not os.path.isdir(a)), None)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else \
        f"{n >> 10} KiB" if n >= 1 << 10 and not n % (1 << 10) else f"{n} bytes"
