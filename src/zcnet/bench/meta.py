"""Metadata every result carries, and the JSON envelope all commands share
(``zcnet.bench.records.envelope``: ``env`` holds what makes two runs comparable: kernel, CPU,
Python, lab or not, NIC settings when known), written atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path

from zcnet import __version__
from zcnet.bench.records import (
    ComparisonFile,
    Env,
    Machine,
    NicFile,
    ResultFile,
    ResultRow,
    to_json,
)
from zcnet.errors import ZcnetError
from zcnet.jsonvalue import JSONObject, JSONValue
from zcnet.uring.syscall import backend


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a measuring run; ``doc`` holds what was measured, with ``complete`` False."""

    def __init__(self, doc: ResultFile) -> None:
        super().__init__()
        self.doc = doc


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect_env(*, lab: bool, machine: Machine | None = None, nic: JSONValue = None,
                remote: str | None = None, target: JSONValue = None,
                hw_counters: str | None = None, extra: JSONObject | None = None) -> Env:
    """What the results were measured on; ``extra`` adds what a command knows besides."""
    return Env(kernel=platform.release(), cpus=os.cpu_count() or 1, cpu_model=cpu_model(),
               arch=platform.machine(), python=platform.python_version(), hot_path=backend(),
               lab=lab, hostname=platform.node(), time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               machine=machine, nic=nic, remote=remote, target=target, hw_counters=hw_counters,
               extra=dict(extra or {}))


def envelope(kind: str, env: Env, results: list[ResultRow]) -> ResultFile:
    """A result file of ``kind`` with this process's version and arguments."""
    return ResultFile(version=__version__, kind=kind, argv=sys.argv[1:], env=env,
                      results=results)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write a regular file atomically (a temporary file renamed over it), so an interrupted run
    never leaves half a file. Anything else that exists there (``/dev/null``, a FIFO) is written
    in place: renaming over it would replace the device node itself. Raises OSError."""
    target = Path(path)
    if target.exists() and not target.is_file():
        with open(target, "w") as f:
            f.write(text)
        return
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with contextlib.ExitStack() as undo:
        undo.callback(tmp.unlink, missing_ok=True)   # unless renamed into place
        tmp.write_text(text)
        os.replace(tmp, target)
        undo.pop_all()


def write_json(path: str | os.PathLike[str], doc: ResultFile | ComparisonFile | NicFile) -> None:
    """Write atomically, so an interrupted run never leaves half a file."""
    try:
        write_text_atomic(path, json.dumps(to_json(doc), indent=2, sort_keys=False) + "\n")
    except OSError as e:
        raise ZcnetError(f"cannot write {path}: {e.strerror or e}",
                         "pass a path in an existing, writable directory") from None
