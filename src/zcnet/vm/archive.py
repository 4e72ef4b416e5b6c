"""Fetching Debian kernels through a private apt configuration.

Some facts about Debian's kernel packages that shape this module:

- The image package is ``linux-image-<abi>-<flavour>`` (``<abi>`` like ``7.3.4+deb13``). In recent
  suites it is a small package that depends on ``linux-binary-<abi>-<flavour>`` (vmlinuz),
  ``linux-modules-…`` (the ``.ko.xz`` files) and ``linux-base-…`` (the ``config``); older ones
  carry all of that themselves. So we download the image package plus every dependency whose
  name carries the same ``<abi>-<flavour>``, and look for the files wherever they landed.
- Names come and go (sid drops old ABIs), so nothing is pinned: the names are listed from the
  archive's index at run time and the newest one >= 7.2 (or the one asked for) is taken.
- The ``cloud`` flavour has no 9p, which the guest needs for the host's filesystem: the generic
  ``amd64`` flavour is used.
- apt runs with its own sources list, lists and cache directories (under the zcnet cache), so
  the system's sources and state stay untouched; the archive host is the one the system's own
  sources name (or ``ZCNET_VM_MIRROR``).
"""

from __future__ import annotations

import fcntl
import logging
import lzma
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from zcnet.errors import ZcnetError
from zcnet.vm.bootimage import extract_vmlinux
from zcnet.vm.kernels import (
    MIN_VERSION,
    BrokenEntry,
    Kernel,
    cache_dir,
    cache_root,
    kernels_dir,
    matches,
    scan,
    version_tuple,
)
from zcnet.vm.sources import Mirror, system_mirror

log = logging.getLogger(__name__)

SUITES = ("trixie-backports", "sid")
FLAVOUR = "amd64"
# What the guest loads: the host's filesystem over 9p, overlays, veth for labs. Their
# dependencies are added from each module's own ``depends=`` field.
GUEST_MODULES = ("9p", "9pnet_virtio", "overlay", "veth")

# ABI forms: 7.3.4+deb13 (current) and 6.1.0-18 (older); a flavour such as -cloud or -rt follows.
_IMAGE = re.compile(
    rf"^linux-image-(?P<abi>(?P<version>\d+\.\d+(?:\.\d+)?)(?:-\d+)?(?:\+[^\s-]+)?)-{FLAVOUR}$")


class ArchiveUnreachable(ZcnetError):
    def __init__(self, mirror: str, detail: str) -> None:
        cached = [k.release for k in scan(kernels_dir())[0]]
        super().__init__(f"cannot reach the Debian archive at {mirror}: {detail}",
                         "check the network (or set ZCNET_VM_MIRROR to a reachable Debian "
                         "mirror); " + (f"cached kernels need none: --kernel {cached[0]}"
                                        if cached else
                                        "a kernel fetched once is cached and needs no network"))


class NoSuchKernel(ZcnetError):
    pass


@dataclass(frozen=True)
class Candidate:
    package: str
    abi: str
    version: str
    package_version: str
    depends: tuple[str, ...]

    @property
    def release(self) -> str:
        return f"{self.abi}-{FLAVOUR}"


class Apt:
    """apt-get/apt-cache with private sources, lists and cache under ``state``."""

    def __init__(self, mirror: Mirror, state: Path) -> None:
        self.mirror = mirror
        self.state = state
        for sub in ("lists/partial", "cache/archives/partial"):
            cache_dir(state / sub)
        signed = f" [signed-by={mirror.keyring}]" if mirror.keyring else ""
        sources = state / "sources.list"
        sources.write_text("".join(f"deb{signed} {mirror.uri} {suite} main\n" for suite in SUITES))
        self.options = [
            "-o", f"Dir::Etc::sourcelist={sources}",
            "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={state / 'lists'}",
            "-o", f"Dir::Cache={state / 'cache'}",
            "-o", "Dir::Etc::preferencesparts=-",
            "-o", f"APT::Architecture={FLAVOUR}",
            "-o", "APT::Sandbox::User=root",
            "-o", "Acquire::Retries=2",
            "-o", "Acquire::http::Timeout=20",
        ]

    def _run(self, tool: str, *args: str,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([tool, *self.options, *args], cwd=cwd, capture_output=True,
                                  text=True, stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError:
            raise ZcnetError(f"`{tool}` is missing: fetching kernels needs apt",
                             "run on a Debian/Ubuntu system with apt") from None

    def query(self, *args: str) -> str:
        """``apt-cache ARGS`` against the private lists: its standard output."""
        return self._run("apt-cache", *args).stdout

    def update(self) -> None:
        proc = self._run("apt-get", "-q", "--error-on=any", "update")
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() + proc.stdout.splitlines()
                     if ln.startswith(("E:", "W:", "Err:"))]
            raise ArchiveUnreachable(self.mirror.uri, lines[0] if lines else
                                     f"apt-get update exited {proc.returncode}")

    def candidates(self) -> list[Candidate]:
        """Image packages of our flavour, >= 7.2, that the archive offers; newest first."""
        names = self.query("pkgnames", "linux-image-").split()
        wanted = [n for n in names if (m := _IMAGE.match(n))
                  and version_tuple(m.group("version")) >= MIN_VERSION]
        if not wanted:
            return []
        found = []
        for record in self.query("show", "--no-all-versions", *wanted).split("\n\n"):
            fields = _fields(record)
            m = _IMAGE.match(fields.get("Package", ""))
            if m is None or "Version" not in fields:
                continue
            depends = tuple(alt.split()[0] for dep in fields.get("Depends", "").split(",")
                            for alt in dep.split("|") if alt.strip())
            found.append(Candidate(m.group(0), m.group("abi"), m.group("version"),
                                   fields["Version"], depends))
        return sorted(found, key=lambda c: (version_tuple(c.version), c.package), reverse=True)

    def download(self, packages: list[str], into: Path) -> list[Path]:
        proc = self._run("apt-get", "-q", "download", *packages, cwd=into)
        if proc.returncode != 0:
            raise ArchiveUnreachable(self.mirror.uri, (proc.stderr.strip().splitlines()
                                                       or ["apt-get download failed"])[-1])
        return sorted(into.glob("*.deb"))


def extract_deb(deb: Path, tree: Path) -> None:
    """Unpack the files of the package ``deb`` under ``tree`` (``dpkg-deb -x``)."""
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True, capture_output=True)


def _fields(record: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in record.splitlines():
        if line[:1].isspace() or ":" not in line:
            continue
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def choose(candidates: list[Candidate], wanted: str) -> Candidate:
    """The newest candidate matching ``wanted``; if the archive no longer offers that one, the
    newest of all (names move, so a pinned version must not be a hard failure), with a warning."""
    if not candidates:
        raise NoSuchKernel(f"no Debian kernel >= {'.'.join(map(str, MIN_VERSION))} in "
                           f"{', '.join(SUITES)}", "check the archive, or set ZCNET_VM_MIRROR")
    for cand in candidates:
        if matches(wanted, cand.version, cand.release):
            return cand
    offered = ", ".join(sorted({c.version for c in candidates}, key=version_tuple))
    log.warning("the archive offers no kernel matching %s (offered: %s); taking the newest, %s",
                wanted, offered, candidates[0].release)
    return candidates[0]


def packages_for(cand: Candidate) -> list[str]:
    """The image package and its dependencies built from the same ABI and flavour."""
    tag = f"{cand.abi}-{FLAVOUR}"
    deps = [d for d in cand.depends if d.endswith(tag) and not d.endswith("-dbg")]
    return [cand.package, *dict.fromkeys(deps)]


@contextmanager
def _cache_lock() -> Iterator[None]:
    root = cache_dir(kernels_dir())
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def fetch(wanted: str = "latest", mirror: Mirror | None = None) -> tuple[Kernel, bool]:
    """Make the kernel ``wanted`` available in the cache; returns (kernel, downloaded).

    A specific version already cached is returned without touching the network; ``latest``
    asks the archive which is newest and downloads it only if it is not cached yet. A cached
    entry that is damaged (``Kernel.verify``) is downloaded again and replaced."""
    if wanted != "latest" and (hit := _whole(wanted)) is not None:
        return hit, False
    mirror = mirror or system_mirror()
    with _cache_lock():
        _sweep_partial_fetches()
        apt = Apt(mirror, cache_root() / "apt")
        apt.update()
        cand = choose(apt.candidates(), wanted)
        dest = kernels_dir() / cand.release
        if dest.exists() and (hit := _whole(cand.release)) is not None:
            return hit, False
        with ExitStack() as stack:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix=".fetch-", dir=kernels_dir())))
            (work / "debs").mkdir()
            debs = apt.download(packages_for(cand), work / "debs")
            kernel = _unpack(cand, debs, work)
            if dest.exists():
                shutil.rmtree(dest)
            kernel.path.rename(dest)
        return Kernel.load(dest), True


def _whole(wanted: str) -> Kernel | None:
    """The newest cached kernel matching ``wanted`` whose files are whole, or None; a damaged
    one is passed over (with a warning), to be fetched again."""
    good, broken = scan(kernels_dir())
    for exc in broken:
        log.warning("%s; fetching it again if the archive has it", exc.message)
    for kernel in good:
        if matches(wanted, kernel.version, kernel.release):
            try:
                kernel.verify()
            except BrokenEntry as exc:
                log.warning("%s; fetching it again", exc.message)
                continue
            return kernel
    return None


def _sweep_partial_fetches() -> None:
    """Remove the work directories of fetches that were killed (SIGTERM, SIGKILL, power) before
    their own cleanup ran; a kernel's debs and tree are hundreds of MB. Called under the cache
    lock, so no live fetch owns any of them."""
    for stale in kernels_dir().glob(".fetch-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _unpack(cand: Candidate, debs: list[Path], work: Path) -> Kernel:
    tree = work / "tree"
    for deb in debs:
        extract_deb(deb, tree)
    moddir = next((p for p in (tree / "usr/lib/modules" / cand.release,
                               tree / "lib/modules" / cand.release) if p.is_dir()), None)
    vmlinuz = _first(tree, [f"boot/vmlinuz-{cand.release}",
                            f"usr/lib/modules/{cand.release}/vmlinuz"])
    config = _first(tree, [f"boot/config-{cand.release}",
                           f"usr/lib/modules/{cand.release}/config"])
    if moddir is None or vmlinuz is None or config is None:
        raise ZcnetError(f"the packages of {cand.package} lack vmlinuz, config or modules "
                         f"(got {', '.join(d.name for d in debs)})",
                         "try another version with --kernel")
    out = work / "kernel"
    (out / "modules").mkdir(parents=True)
    shutil.copy(vmlinuz, out / "vmlinuz")
    extract_vmlinux(out / "vmlinuz", out / "vmlinux")
    shutil.copy(config, out / "config")
    order = _install_modules(moddir, out / "modules")
    (out / "modules.order").write_text("\n".join(order) + "\n")
    kernel = Kernel(out, cand.release, cand.version, cand.package_version,
                    tuple(d.name.split("_")[0] for d in debs))
    kernel.save_meta()
    return kernel


def _first(tree: Path, paths: list[str]) -> Path | None:
    return next((tree / p for p in paths if (tree / p).is_file()), None)


def _modname(path: Path) -> str:
    return path.name.split(".ko")[0].replace("-", "_")


def _depends(image: bytes) -> list[str]:
    m = re.search(rb"\0depends=([^\0]*)\0", image)
    return [d.replace("-", "_") for d in m.group(1).decode().split(",") if d] if m else []


def _install_modules(moddir: Path, out: Path) -> list[str]:
    """Decompress GUEST_MODULES and their dependencies into ``out``; return the load order."""
    index = {_modname(p): p for p in moddir.rglob("*.ko*")}
    builtin = {_modname(Path(line)) for line in
               (moddir / "modules.builtin").read_text().split()} \
        if (moddir / "modules.builtin").is_file() else set()
    order: list[str] = []

    def visit(name: str) -> None:
        if f"{name}.ko" in order or name in builtin:
            return
        src = index.get(name)
        if src is None:
            raise ZcnetError(f"module {name} is neither built in nor shipped in {moddir.name}",
                             "try another version with --kernel")
        data = src.read_bytes()
        if src.name.endswith(".xz"):
            data = lzma.decompress(data)
        elif src.name.endswith((".zst", ".gz")):
            raise ZcnetError(f"module {src.name}: only .ko and .ko.xz are supported",
                             "try another version with --kernel")
        for dep in _depends(data):
            visit(dep)
        (out / f"{name}.ko").write_bytes(data)
        order.append(f"{name}.ko")

    for name in GUEST_MODULES:
        visit(name)
    return order
