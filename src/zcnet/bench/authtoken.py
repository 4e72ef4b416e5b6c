"""The shared secret of ``zcnet server`` and ``zcnet client``: token files, read safely, and the
per-user default token file that both use when no ``--token-file`` is given.

Some facts about token files, and why the checks are these:

- Every listener authenticates (HMAC challenge-response), loopback included: on a shared host a
  root server that obeyed any local user would hand out ports, connections and processes.
  Without ``--token-file`` the server uses ``$XDG_CONFIG_HOME/zcnet/token`` (else
  ``~/.config/zcnet/token``) of the user it runs as, creating it on first use; the client reads
  the same file of *its* user. So the same user's client is let in, and nobody else.
- A token others can read is no secret, and one others can write (or replace, through a
  directory they can write) lets them choose it: such files are refused, as ssh refuses its
  keys, with the ``chmod`` that fixes them. So is a file owned by another user (root aside),
  who could change it at will.
- The default file is created atomically: the secret is written to a private temporary name
  (``O_EXCL|O_NOFOLLOW``, mode 0600) and then hard-linked into place, so a reader never sees a
  half-written token and two servers starting at once agree on one. It is opened with
  ``O_NOFOLLOW``: a symlink planted there is refused, never followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

from zcnet.errors import UsageError, ZcnetError
from zcnet.userfile import FileProblem, file_in_the_way, read_bytes

MIN_TOKEN = 8
MAX_TOKEN = 4096
TOKEN_NAME = "token"


def default_token_path() -> Path:
    """``$XDG_CONFIG_HOME/zcnet/token``, else ``~/.config/zcnet/token``."""
    base = os.environ.get("XDG_CONFIG_HOME")
    if not base or not os.path.isabs(base):   # the XDG spec: relative values are ignored
        home = os.environ.get("HOME") or pwd.getpwuid(os.geteuid()).pw_dir
        base = os.path.join(home, ".config")
    return Path(base) / "zcnet" / TOKEN_NAME


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _check_owner_mode(path: Path | str, st: os.stat_result, what: str, bits: int,
                      fix: str) -> None:
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise UsageError(f"{what} {path} belongs to user {_owner_name(st.st_uid)}, not to "
                         f"{_owner_name(me)}: they could change it",
                         f"use a {what} you own (e.g. copy it and `chmod 600` the copy)")
    if st.st_mode & bits:
        raise UsageError(f"{what} {path} is accessible to other users "
                         f"(mode {stat.S_IMODE(st.st_mode):04o})", f"{fix} {path}")


_ELSEWHERE = "set XDG_CONFIG_HOME to a directory you own, or pass --token-file FILE"
_MAKE_ONE = "make one with e.g. `(umask 077; head -c 32 /dev/urandom | base64 > FILE)`"


def read_token(path: Path | str, *, follow_symlinks: bool = True) -> bytes:
    """The secret in ``path`` (first line, stripped); refused unless only its owner (this user,
    or root) can read or change it. ``follow_symlinks=False`` is for the default file, whose
    fixes are about the file the server creates."""
    default = not follow_symlinks
    redo = f"remove {path} (the server creates a new one)"

    def owner_mode(st: os.stat_result) -> None:
        _check_owner_mode(path, st, "token file", 0o077, "chmod 600")

    try:
        data = read_bytes(path, "token file", limit=MAX_TOKEN, nofollow=default,
                          fix=redo if default else "give a file whose first line is the secret "
                                                   "(e.g. 32 random bytes in base64), mode 600",
                          check=owner_mode)
    except FileProblem as e:
        if e.errno == errno.ELOOP and default:
            raise UsageError(f"token file {path} is a symlink", redo) from None
        if e.errno == errno.ENOENT:
            hint = ("start `zcnet server` once as this user (it creates the file), or pass "
                    "--token-file FILE" if default else _MAKE_ONE)
            raise UsageError(e.message, hint) from None
        raise
    token = data.split(b"\n", 1)[0].strip()
    if len(token) < MIN_TOKEN:
        raise UsageError(f"token in {path} is shorter than {MIN_TOKEN} bytes",
                         redo if default else _MAKE_ONE)
    return token


def token_from_stream(stream: BinaryIO, where: str) -> bytes:
    """The secret on the first line of ``stream`` (``--token-file -``): at most ``MAX_TOKEN``
    bytes are read, so endless input without a newline is refused, not held in memory."""
    line = stream.readline(MAX_TOKEN + 1)
    if len(line) > MAX_TOKEN:
        raise UsageError(f"token on {where} is longer than {MAX_TOKEN} bytes",
                         "send one line (e.g. 32 random bytes in base64)")
    token = line.strip()
    if len(token) < MIN_TOKEN:
        raise UsageError(f"token on {where} is shorter than {MIN_TOKEN} bytes",
                         "send a longer secret")
    return token


def default_token(*, create: bool) -> bytes:
    """The per-user token; ``create``: make it (and its directory, mode 0700) on first use."""
    path = default_token_path()
    if create:
        _ensure_dir(path.parent)
        if not os.path.lexists(path):
            _create(path)
    else:
        _check_dir(path.parent)
    return read_token(path, follow_symlinks=False)


def _check_dir(d: Path) -> None:
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return   # reading the token then says what to do
    except OSError as e:
        raise UsageError(f"cannot use {d}: {_why(d, e)}", _ELSEWHERE) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{d} is not a directory (a symlink?)",
                         f"remove it: rm {d} (the server creates the directory, mode 0700)")
    _check_owner_mode(d, st, "directory", 0o022, "chmod 700")


def _ensure_dir(d: Path) -> None:
    try:
        d.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
    except OSError as e:
        raise ZcnetError(f"cannot create {d}: {_why(d, e)}", _ELSEWHERE) from None
    _check_dir(d)


def _why(d: Path, e: OSError) -> str:
    """What stops ``d`` being used: a file where one of its directories should be (mkdir says
    EEXIST, lstat ENOTDIR), else the error."""
    file = file_in_the_way(d.parent)
    return f"{file} is not a directory" if file is not None else str(e.strerror)


def _create(path: Path) -> None:
    tmp = path.with_name(f".{TOKEN_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.fchmod(fd, 0o600)   # whatever the umask said
            os.write(fd, secrets.token_hex(32).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):   # another server won the race: use its
            os.link(tmp, path)
    except OSError as e:
        raise ZcnetError(f"cannot create token file {path}: {e.strerror}", _ELSEWHERE) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
