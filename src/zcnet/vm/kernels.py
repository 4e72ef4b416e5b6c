"""The kernel cache: Debian kernels unpacked under ``$XDG_CACHE_HOME/zcnet/kernels/<release>/``.

Each entry holds ``vmlinuz`` (and ``vmlinux``, its uncompressed PVH-bootable form, when it could
be extracted), the kernel's ``config``, the modules the guest needs (decompressed,
so busybox's ``insmod`` can load them), ``modules.order`` (load order, dependencies first) and
``kernel.json`` (release, upstream version, Debian package version, packages it came from, and
the size and SHA-256 of each file). An entry appears by an atomic rename once complete, so a
half-written one is never listed; one damaged later is found by ``Kernel.verify`` (see
``zcnet.vm.integrity``) before it is booted.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from zcnet.errors import UsageError, ZcnetError
from zcnet.jsonvalue import JSONValue
from zcnet.userfile import FileProblem, file_in_the_way, read_text
from zcnet.vm.integrity import bzimage_problem, elf_problem, manifest, manifest_problem

log = logging.getLogger(__name__)

KERNEL_JSON = "kernel.json"
MIN_VERSION = (7, 2)
MAX_META = 64 << 10        # kernel.json, modules.order: a few hundred bytes each
MAX_CONFIG = 4 << 20       # a kernel config is ~300 KB
REFETCH = "`zcnet vm fetch` gets the kernel again"
_WHERE = "set XDG_CACHE_HOME to a directory you can write"
_MODULE = re.compile(r"[\w-]{1,64}\.ko\Z")
_RELEASE = re.compile(r"[\w.+~-]{1,128}\Z")
_FILE = re.compile(r"(modules/)?\w[\w.+-]{0,127}\Z")   # vmlinuz, modules/veth.ko


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/zcnet``, else ``~/.cache/zcnet`` (relative values are ignored, as the
    XDG spec says)."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):
        base = str(Path.home() / ".cache")
    return Path(base) / "zcnet"


def cache_dir(path: Path) -> Path:
    """``path`` (a directory under the cache) created if missing; a one-line error naming it
    and the fix if it cannot be (a file in the way, no permission, a read-only file system)."""
    if (blocker := file_in_the_way(path)) is not None:
        raise ZcnetError(f"cannot use the cache directory {path}: {blocker} is not a directory",
                         _WHERE)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ZcnetError(f"cannot create the cache directory {path}: {exc.strerror}",
                         _WHERE) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ZcnetError(f"cannot write in the cache directory {path}", _WHERE)
    return path


class BrokenEntry(ZcnetError):
    """A cache entry that is damaged: missing, truncated or foreign files, or metadata that is
    not what zcnet writes. The fix removes it so that it is made again."""

    def __init__(self, path: Path, problem: str, remake: str = REFETCH) -> None:
        super().__init__(f"broken cache entry {path}: {problem}",
                         f"remove it (rm -r {path}); {remake}")
        self.path = path


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
    # {file: [size, sha256]} recorded when the entry was made (entries before it have none).
    files: dict[str, list[int | str]] | None = field(default=None, compare=False)
    remake: str = field(default=REFETCH, compare=False)   # how to make the entry again

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
        return [self.path / "modules" / name for name in self._module_names()]

    def _module_names(self) -> list[str]:
        path = self.path / "modules.order"
        names = self._read(path, MAX_META).split()
        if bad := [n for n in names if not _MODULE.match(n)]:
            raise BrokenEntry(self.path, f"modules.order names {bad[0][:40]!r}, not a module",
                              self.remake)
        return names

    def _read(self, path: Path, limit: int) -> str:
        try:
            return read_text(path, "cache file", limit=limit, fix="")
        except FileProblem as exc:
            raise BrokenEntry(self.path, exc.message, self.remake) from None

    def config(self) -> dict[str, str]:
        """CONFIG_X -> value (``y``, ``m``, a string); options that are not set are absent."""
        out = {}
        for line in self._read(self.config_path, MAX_CONFIG).splitlines():
            key, sep, value = line.partition("=")
            if sep and key.startswith("CONFIG_"):
                out[key] = value.strip('"')
        return out

    def boot_files(self) -> list[str]:
        """The entry's files a boot reads, relative to its directory."""
        images = ["vmlinuz", *(["vmlinux"] if (self.path / "vmlinux").exists() else [])]
        return [*images, "config", "modules.order",
                *(f"modules/{name}" for name in self._module_names())]

    def verify(self) -> None:
        """Raise :class:`BrokenEntry` unless every file a boot reads is there and whole: as
        recorded when the entry was made, and as the formats say (see zcnet.vm.integrity)."""
        names = self.boot_files()
        why = (manifest_problem(self.path, self.files) if self.files is not None else None) \
            or next(filter(None, map(self._file_problem, names)), None)
        if why is None and not self.config():
            why = "config holds no CONFIG_ option"
        if why is not None:
            raise BrokenEntry(self.path, why, self.remake)

    def _file_problem(self, name: str) -> str | None:
        path = self.path / name
        if not path.is_file():
            return f"{name} is missing"
        if name == "vmlinuz":
            return bzimage_problem(path)
        if name == "vmlinux" or name.startswith("modules/"):
            return elf_problem(path)
        return None

    @classmethod
    def load(cls, path: Path, remake: str = REFETCH) -> Kernel:
        """The entry in ``path``; :class:`BrokenEntry` if its metadata is not what zcnet
        writes. Its files are checked by ``verify``."""
        meta = read_json(path / KERNEL_JSON, remake)
        if why := _meta_problem(meta):
            raise BrokenEntry(path, f"{KERNEL_JSON}: {why}", remake)
        return cls(path, meta["release"], meta["version"], meta["package_version"],
                   tuple(meta["packages"]), meta.get("files"), remake)

    def save_meta(self) -> None:
        """Write ``kernel.json``, with the size and digest of every boot file as they are now."""
        meta = {"release": self.release, "version": self.version,
                "package_version": self.package_version, "packages": list(self.packages),
                "files": manifest(self.path, self.boot_files())}
        (self.path / KERNEL_JSON).write_text(json.dumps(meta, indent=1) + "\n")


def read_json(path: Path, remake: str = REFETCH) -> JSONValue:
    """A small JSON file of the cache entry ``path.parent``; :class:`BrokenEntry` if it cannot
    be read or is not JSON."""
    try:
        doc: JSONValue = json.loads(read_text(path, "cache file", limit=MAX_META, fix=""))
        return doc
    except FileProblem as exc:
        raise BrokenEntry(path.parent, exc.message, remake) from None
    except (ValueError, RecursionError) as exc:
        raise BrokenEntry(path.parent, f"{path.name} is not JSON ({exc})", remake) from None


def _meta_problem(meta: JSONValue) -> str | None:
    """Why ``meta`` is not a ``kernel.json`` as ``save_meta`` writes it, or None."""
    if not isinstance(meta, dict):
        return "not a JSON object"
    for key, ok in (("release", lambda v: isinstance(v, str) and _RELEASE.match(v)),
                    ("version", lambda v: isinstance(v, str)
                     and re.fullmatch(r"\d+(\.\d+){0,3}", v)),
                    ("package_version", lambda v: isinstance(v, str) and 0 < len(v) <= 128),
                    ("packages", lambda v: isinstance(v, list) and len(v) <= 64
                     and all(isinstance(p, str) for p in v))):
        if key not in meta:
            return f"no {key!r}"
        if not ok(meta[key]):
            return f"{key!r} is {str(meta[key])[:40]!r}"
    files = meta.get("files")
    if files is not None and not (
            isinstance(files, dict) and all(
                isinstance(k, str) and _FILE.match(k) and isinstance(v, list) and len(v) == 2
                and type(v[0]) is int and isinstance(v[1], str) for k, v in files.items())):
        return "'files' is not a list of sizes and digests"
    return None


def scan(root: Path, remake: str = REFETCH) -> tuple[list[Kernel], list[BrokenEntry]]:
    """The entries under ``root`` whose metadata reads, newest version first, and the ones
    whose metadata does not. Directories starting with '.' are work in progress."""
    if not os.path.isdir(root):   # absent, or a name the file system refuses
        return [], []
    good, broken = [], []
    for entry in root.iterdir():
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        try:
            good.append(Kernel.load(entry, remake))
        except BrokenEntry as exc:
            broken.append(exc)
    good.sort(key=lambda k: (version_tuple(k.version), k.release), reverse=True)
    return good, broken


def cached_kernels() -> list[Kernel]:
    """Cached kernels, newest version first; a :class:`BrokenEntry` if any entry is damaged
    (a kernel chosen among the others would not be the one asked for)."""
    good, broken = scan(kernels_dir())
    if broken:
        raise broken[0]
    return good


def find_cached(wanted: str) -> Kernel | None:
    """The newest cached kernel matching ``wanted`` (see ``matches``), or None."""
    for kernel in cached_kernels():
        if matches(wanted, kernel.version, kernel.release):
            return kernel
    return None
