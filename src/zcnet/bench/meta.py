"""Metadata every result carries, and the JSON envelope all commands share.

Envelope: ``{"tool": "zcnet", "version", "kind", "env": {...}, "results": [...]}``. ``env`` holds
what makes two runs comparable (kernel, CPU, Python, lab or not, NIC settings when known).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from zcnet import __version__
from zcnet.errors import ZcnetError
from zcnet.uring.syscall import backend

ENVELOPE_VERSION = 1


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a measuring run; ``doc`` holds what was measured, with ``complete`` False."""

    def __init__(self, doc: dict[str, Any]) -> None:
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


def collect_env(*, lab: bool, **extra: Any) -> dict[str, Any]:
    """What the results were measured on. ``extra`` adds e.g. ``nic`` or ``placement`` notes."""
    env: dict[str, Any] = {
        "kernel": platform.release(),
        "cpus": os.cpu_count() or 1,
        "cpu_model": cpu_model(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "hot_path": backend(),  # the ring's hot path: "c" (compiled accelerator) or "pure"
        "lab": lab,
        "hostname": platform.node(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    env.update(extra)
    return env


def envelope(kind: str, env: dict[str, Any], results: list[dict[str, Any]],
             **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "tool": "zcnet",
        "version": __version__,
        "format": ENVELOPE_VERSION,
        "kind": kind,
        "argv": sys.argv[1:],
        "env": env,
        "results": results,
    }
    doc.update(extra)
    return doc


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


def write_json(path: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """Write atomically, so an interrupted run never leaves half a file."""
    try:
        write_text_atomic(path, json.dumps(doc, indent=2, sort_keys=False) + "\n")
    except OSError as e:
        raise ZcnetError(f"cannot write {path}: {e.strerror or e}",
                         "pass a path in an existing, writable directory") from None
