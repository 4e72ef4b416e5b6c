"""The kernel cache: Debian kernels unpacked under ``$XDG_CACHE_HOME/zcnet/kernels/<release>/``.

Each entry holds ``vmlinuz`` (and ``vmlinux``, its uncompressed PVH-bootable form, when it could
be extracted), the kernel's ``config``, the modules the guest needs (decompressed,
so busybox's ``insmod`` can load them), ``modules.order`` (load order, dependencies first) and
``kernel.json`` (release, upstream version, Debian package version, packages it came from). An
entry appears by an atomic rename once complete, so a half-written one is never listed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from zcnet.errors import UsageError, ZcnetError

KERNEL_JSON = "kernel.json"
MIN_VERSION = (7, 2)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zcnet"


def kernels_dir() -> Path:
    return cache_root() / "kernels"


def version_tuple(version: str) -> tuple[int, ...]:
    """``"7.3.4"`` -> ``(7, 3, 4)``; the numeric prefix of a release string."""
    m = re.match(r"(\d+(?:\.\d+)*)", version)
    if m is None:
        raise UsageError(f"not a kernel version: {version!r}", "give e.g. 7.2, 7.3.4 or latest")
    return tuple(int(x) for x in m.group(1).split("."))


def matches(wanted: str, version: str, release: str) -> bool:
    """``wanted`` is ``latest``, an exact release, or a version prefix (``7.2`` matches 7.2.13)."""
    if wanted == "latest" or wanted == release:
        return True
    return version == wanted or version.startswith(wanted + ".")


@dataclass(frozen=True)
class Kernel:
    """One cached kernel."""

    path: Path
    release: str           # uname -r inside the guest, e.g. 7.3.4+deb13-amd64
    version: str           # upstream version, e.g. 7.3.4
    package_version: str   # Debian version of the packages, e.g. 7.3.4-1~bpo13+1
    packages: tuple[str, ...]

    @property
    def vmlinuz(self) -> Path:
        return self.path / "vmlinuz"

    @property
    def boot_image(self) -> Path:
        """The uncompressed PVH ``vmlinux`` if the cache has one (boots faster), else vmlinuz."""
        vmlinux = self.path / "vmlinux"
        return vmlinux if vmlinux.is_file() else self.vmlinuz

    @property
    def config_path(self) -> Path:
        return self.path / "config"

    @property
    def modules(self) -> list[Path]:
        """Module files in load order."""
        order = (self.path / "modules.order").read_text().split()
        return [self.path / "modules" / name for name in order]

    def config(self) -> dict[str, str]:
        """CONFIG_X -> value (``y``, ``m``, a string); options that are not set are absent."""
        out = {}
        for line in self.config_path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and key.startswith("CONFIG_"):
                out[key] = value.strip('"')
        return out

    @classmethod
    def load(cls, path: Path) -> Kernel:
        try:
            meta = json.loads((path / KERNEL_JSON).read_text())
            return cls(path, meta["release"], meta["version"], meta["package_version"],
                       tuple(meta["packages"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ZcnetError(f"broken kernel cache entry {path}: {exc}",
                             f"remove it (rm -r {path}) and run `zcnet vm fetch`") from None

    def save_meta(self) -> None:
        meta = {"release": self.release, "version": self.version,
                "package_version": self.package_version, "packages": list(self.packages)}
        (self.path / KERNEL_JSON).write_text(json.dumps(meta, indent=1) + "\n")


def cached_kernels() -> list[Kernel]:
    """Complete cache entries, newest version first."""
    root = kernels_dir()
    if not root.is_dir():
        return []
    found = [Kernel.load(p) for p in root.iterdir()
             if not p.name.startswith(".") and (p / KERNEL_JSON).is_file()]
    return sorted(found, key=lambda k: (version_tuple(k.version), k.release), reverse=True)


def find_cached(wanted: str) -> Kernel | None:
    """The newest cached kernel matching ``wanted`` (see ``matches``), or None."""
    for kernel in cached_kernels():
        if matches(wanted, kernel.version, kernel.release):
            return kernel
    return None
