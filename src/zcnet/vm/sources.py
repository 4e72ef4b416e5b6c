"""Which Debian archive to fetch from: the host the system's own apt sources name.

Both source formats are read: one-line ``sources.list`` entries and deb822 ``*.sources``
paragraphs. The first ``deb`` entry for the main archive (not a security or updates suite) wins;
its ``signed-by`` keyring is reused when it is a file. ``ZCNET_VM_MIRROR`` overrides the host.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from zcnet.errors import ZcnetError

APT_ETC = Path("/etc/apt")
DEFAULT_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
MIRROR_ENV = "ZCNET_VM_MIRROR"


@dataclass(frozen=True)
class Mirror:
    uri: str
    keyring: str | None


@dataclass(frozen=True)
class _Entry:
    types: tuple[str, ...]
    uris: tuple[str, ...]
    suites: tuple[str, ...]
    signed_by: str | None


def _one_line(text: str) -> list[_Entry]:
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^(deb(?:-src)?)\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)", line)
        if m is None:
            continue
        opts = dict(o.split("=", 1) for o in (m.group(2) or "").split() if "=" in o)
        out.append(_Entry((m.group(1),), (m.group(3),), (m.group(4),), opts.get("signed-by")))
    return out


def _deb822(text: str) -> list[_Entry]:
    out = []
    for para in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for line in para.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace() and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if fields.get("enabled", "yes").lower() == "no" or "uris" not in fields:
            continue
        signed = fields.get("signed-by", "").strip()
        out.append(_Entry(tuple(fields.get("types", "").split()), tuple(fields["uris"].split()),
                          tuple(fields.get("suites", "").split()),
                          signed if signed and "\n" not in signed else None))
    return out


def _entries(etc: Path) -> list[_Entry]:
    out: list[_Entry] = []
    files = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    for path in files:
        if path.is_file():
            out += _one_line(path.read_text(errors="replace"))
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        out += _deb822(path.read_text(errors="replace"))
    return out


def _is_main_archive(entry: _Entry) -> bool:
    return ("deb" in entry.types and bool(entry.suites)
            and not any("security" in u for u in entry.uris)
            and any(not re.search(r"-(security|updates|backports)$|/updates$", s)
                    for s in entry.suites))


def system_mirror(etc: Path = APT_ETC) -> Mirror:
    keyring = str(DEFAULT_KEYRING) if DEFAULT_KEYRING.is_file() else None
    if override := os.environ.get(MIRROR_ENV):
        return Mirror(override, keyring)
    for entry in _entries(etc):
        if _is_main_archive(entry):
            signed = entry.signed_by if entry.signed_by and Path(entry.signed_by).is_file() \
                else keyring
            return Mirror(entry.uris[0], signed)
    raise ZcnetError(f"no Debian archive in the apt sources under {etc}",
                     f"add one to /etc/apt/sources.list, or set {MIRROR_ENV}=URI")
