"""Building zcnet's netdevsim test kernel from Debian's ``linux-source`` package.

The kernel is ``make tinyconfig`` plus the fragment ``nsim/nsim.config`` (netdevsim, udmabuf,
io_uring zcrx, devmem, namespaces, veth, 9p and consoles for the VM runner; everything built in,
no modules), with the project's patch ``nsim/netdevsim-zc.patch`` applied: test scaffolding that
lets netdevsim's RX queues take a memory provider (zcrx, devmem). It is not upstream behaviour.

Some facts that shape this module:

- The source is the newest ``linux-source-X.Y`` >= 7.2 the archive offers (resolved at run time
  through the same private apt configuration ``archive`` uses; nothing pinned). Its tarball is
  kept under ``$XDG_CACHE_HOME/zcnet/nsim/src/`` so a rebuild needs no network.
- A built kernel lives in ``$XDG_CACHE_HOME/zcnet/nsim/<key>/`` with the same layout as a fetched
  Debian kernel (``vmlinuz``, ``config``, an empty ``modules.order``, ``kernel.json``), so the VM
  runner boots it unchanged. ``<key>`` hashes (source package version, fragment, patch): each
  key is built once; a lock serialises builders, and the entry appears by an atomic rename, so a
  failed or interrupted build never leaves a usable-looking entry. The build tree
  (``.build-<hash of source and patch>/``) stays, so an interrupted build resumes and a changed
  fragment rebuilds incrementally (markers say whether unpacking and patching completed).
- Kconfig silently drops an option whose dependencies are missing; every option the fragment
  asks for is checked in the final ``.config`` so such a drop is an error, not a kernel that
  boots without netdevsim.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from zcnet.errors import ZcnetError
from zcnet.vm.archive import Apt, ArchiveUnreachable, extract_deb
from zcnet.vm.child import pdeathsig
from zcnet.vm.integrity import manifest, manifest_problem
from zcnet.vm.kernels import (
    MIN_VERSION,
    BrokenEntry,
    Kernel,
    cache_dir,
    cache_root,
    read_json,
    version_tuple,
)
from zcnet.vm.sources import Mirror, system_mirror

logger = logging.getLogger(__name__)

NSIM = "nsim"
CONFIG_FRAGMENT = "nsim.config"
PATCH = "netdevsim-zc.patch"
BUILD_JSON = "build.json"
FAILED_LOG = "last-failed-build.log"
# Markers in the build tree: the step before them completed.
UNPACKED, PATCHED = ".zcnet-unpacked", ".zcnet-patched"
LOG_TAIL = 30
STOP_GRACE = 10.0  # seconds an interrupted step's make gets to clean up before SIGKILL
# Programs the build runs, and the apt package that has each.
TOOLS = {"gcc": "build-essential", "make": "build-essential", "patch": "patch",
         "flex": "flex", "bison": "bison", "bc": "bc", "tar": "tar", "xz": "xz-utils",
         "dpkg-deb": "dpkg"}
LIBELF_HEADER = Path("/usr/include/gelf.h")
_SOURCE = re.compile(r"^linux-source-(?P<version>\d+\.\d+)$")
_TARBALL = re.compile(r"linux-source-[\w.+~-]+\.tar\.\w+\Z")
REBUILD = "`zcnet vm build-kernel` builds it again"

Progress = Callable[[str], None]


class NoToolchain(ZcnetError):
    def __init__(self, missing: list[str]) -> None:
        pkgs = sorted({TOOLS.get(m, "libelf-dev") for m in missing})
        super().__init__(f"cannot build the netdevsim kernel: missing {', '.join(missing)}",
                         f"apt-get install {' '.join(pkgs)}")


class NoSource(ZcnetError):
    pass


class BuildFailed(ZcnetError):
    def __init__(self, step: str, tail: str, log: Path) -> None:
        super().__init__(f"building the netdevsim kernel failed at {step}; last lines of the "
                         f"log:\n{tail}", f"the whole log is in {log}")


@dataclass(frozen=True)
class Source:
    """One ``linux-source`` package: its name, Debian version and cached tarball."""

    package: str
    package_version: str
    tarball: Path

    @property
    def version(self) -> str:
        return self.package.removeprefix("linux-source-")


def nsim_dir() -> Path:
    return cache_root() / NSIM


def fragment_text() -> str:
    return resources.files(__package__).joinpath(NSIM).joinpath(CONFIG_FRAGMENT).read_text()


def patch_text() -> str:
    return resources.files(__package__).joinpath(NSIM).joinpath(PATCH).read_text()


def fragment_options(text: str) -> dict[str, str]:
    """``CONFIG_X`` -> wanted value (``y``, ``n``, a number) from a fragment."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(CONFIG_\w+)=(\S+)", line.strip())
        if m:
            out[m.group(1)] = m.group(2).strip('"')
        elif m := re.match(r"^# (CONFIG_\w+) is not set", line.strip()):
            out[m.group(1)] = "n"
    return out


def config_mismatches(wanted: dict[str, str], config_text: str) -> list[str]:
    """Options of ``wanted`` whose value in the final ``.config`` differs."""
    have = fragment_options(config_text)
    return [f"{k}={v} (got {have.get(k, 'n')})" for k, v in wanted.items()
            if have.get(k, "n") != v]


def cache_key(package_version: str, fragment: str, patch: str) -> str:
    h = hashlib.sha256()
    for part in (package_version, fragment, patch):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def missing_tools() -> list[str]:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if not LIBELF_HEADER.is_file():
        missing.append(f"libelf headers ({LIBELF_HEADER})")
    return missing


def check_toolchain() -> None:
    if missing := missing_tools():
        raise NoToolchain(missing)


def built_kernels() -> list[tuple[Kernel, dict[str, str]]]:
    """Built entries whose key matches today's fragment and patch, newest source first; a
    :class:`BrokenEntry` for one whose metadata is damaged."""
    root = nsim_dir()
    if not os.path.isdir(root):
        return []
    fragment, patch = fragment_text(), patch_text()
    found = []
    for entry in root.iterdir():
        if entry.name.startswith(".") or not (entry / BUILD_JSON).is_file():
            continue
        meta = read_json(entry / BUILD_JSON, REBUILD)
        try:
            ok = entry.name == cache_key(meta["source_package_version"], fragment, patch)
        except (KeyError, TypeError, AttributeError):
            raise BrokenEntry(entry, f"{BUILD_JSON} lacks the source version", REBUILD) from None
        if ok:
            found.append((Kernel.load(entry, REBUILD), meta))
    return sorted(found, key=lambda km: (version_tuple(km[0].version), km[0].release),
                  reverse=True)


def find_built() -> Kernel | None:
    """The newest built netdevsim kernel for today's fragment and patch, or None (no network)."""
    built = built_kernels()
    return built[0][0] if built else None


@contextmanager
def _lock() -> Iterator[None]:
    root = cache_dir(nsim_dir())
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _cached_sources() -> list[Source]:
    """The source tarballs in the cache that are whole (as their ``source.json`` recorded them,
    where it did); a damaged one is passed over with a warning, to be downloaded again."""
    out = []
    for meta in (nsim_dir() / "src").glob("*/source.json"):
        try:
            data = read_json(meta, REBUILD)
            src = Source(data["package"], data["package_version"], meta.parent / data["tarball"])
            if not (_SOURCE.match(src.package) and _TARBALL.match(data["tarball"])):
                raise BrokenEntry(meta.parent, "source.json is not what zcnet writes", REBUILD)
            if not src.tarball.is_file():
                raise BrokenEntry(meta.parent, f"{src.tarball.name} is missing", REBUILD)
            if "files" in data and (why := manifest_problem(meta.parent, data["files"])):
                raise BrokenEntry(meta.parent, why, REBUILD)
        except (KeyError, TypeError, ValueError) as exc:   # fields missing or of another type
            logger.warning("%s", BrokenEntry(meta.parent, f"source.json: {exc}", REBUILD).message)
            continue
        except BrokenEntry as exc:
            logger.warning("%s", exc.message)
            continue
        out.append(src)
    return sorted(out, key=lambda s: version_tuple(s.version), reverse=True)


def _newest_source_package(apt: Apt) -> tuple[str, str]:
    """(package, Debian version) of the newest linux-source-X.Y >= 7.2 the archive offers."""
    names = [n for n in apt.query("pkgnames", "linux-source-").split()
             if (m := _SOURCE.match(n)) and version_tuple(m.group("version")) >= MIN_VERSION]
    if not names:
        raise NoSource(f"the archive offers no linux-source >= "
                       f"{'.'.join(map(str, MIN_VERSION))}",
                       "set ZCNET_VM_MIRROR to a Debian mirror carrying trixie-backports or sid")
    best = max(names, key=lambda n: version_tuple(n.removeprefix("linux-source-")))
    m = re.search(r"^Version:\s*(\S+)", apt.query("show", "--no-all-versions", best), re.M)
    if m is None:
        raise NoSource(f"apt-cache show {best} gave no version", "retry; check the mirror")
    return best, m.group(1)


def resolve_source(mirror: Mirror | None = None, progress: Progress | None = None,
                   apt: Apt | None = None) -> Source:
    """The newest linux-source >= 7.2: downloaded once, then reused from the cache.

    Without a reachable archive the newest cached tarball is used. ``apt``: the archive to ask
    (default: the private configuration on ``mirror``, else the system's mirror)."""
    say = progress or (lambda _msg: None)
    try:
        apt = apt or Apt(mirror or system_mirror(), cache_root() / "apt")
        apt.update()
        package, version = _newest_source_package(apt)
    except ArchiveUnreachable:
        cached = _cached_sources()
        if not cached:
            raise
        say(f"archive unreachable; using the cached {cached[0].package} "
            f"{cached[0].package_version}")
        return cached[0]
    dest = nsim_dir() / "src" / version
    meta = dest / "source.json"
    if meta.is_file():
        hit = [s for s in _cached_sources() if s.package_version == version]
        if hit:
            return hit[0]
    say(f"downloading {package} {version}")
    cache_dir(nsim_dir())  # a fresh machine has no cache yet
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix=".src-", dir=nsim_dir())))
        (work / "debs").mkdir()
        debs = apt.download([package], work / "debs")
        extract_deb(debs[0], work / "tree")
        tars = sorted((work / "tree/usr/src").glob("linux-source-*.tar.*"))
        if not tars:
            raise NoSource(f"{package} {version} holds no source tarball",
                           "report this; Debian changed the package layout")
        out = work / "out"
        out.mkdir()
        tars[0].rename(out / tars[0].name)
        (out / "source.json").write_text(json.dumps(
            {"package": package, "package_version": version, "tarball": tars[0].name,
             "files": manifest(out, [tars[0].name])}) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        out.rename(dest)
    return Source(package, version, dest / tars[0].name)


def _tail(path: Path, lines: int = LOG_TAIL) -> str:
    text = path.read_text(errors="replace") if path.is_file() else ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:]) or "(empty log)"


class _Builder:
    """One build in a temp tree; each step appends to ``log``."""

    def __init__(self, tree: Path, log: Path, jobs: int) -> None:
        self.tree, self.log, self.jobs = tree, log, jobs

    def step(self, name: str, argv: list[str], *, stdin: Path | None = None) -> None:
        env = dict(os.environ, KBUILD_BUILD_USER="zcnet", KBUILD_BUILD_HOST="zcnet",
                   LC_ALL="C")
        with open(self.log, "ab") as out, ExitStack() as stack:
            out.write(f"\n### {name}: {' '.join(argv)}\n".encode())
            out.flush()
            fin = stack.enter_context(open(stdin, "rb")) if stdin else subprocess.DEVNULL
            # SIGTERM if this process dies unwinding nothing (SIGKILL): make passes it on to
            # the compilers it started and deletes the targets they were writing.
            proc = subprocess.Popen(argv, cwd=self.tree, stdin=fin, stdout=out,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=pdeathsig(signal.SIGTERM))
            stack.enter_context(_whole_group(proc))
            returncode = proc.wait()
        if returncode != 0:
            raise _StepFailed(name)

    def make(self, name: str, *targets: str) -> None:
        self.step(name, ["make", f"-j{self.jobs}", "ARCH=x86_64", *targets])


@contextmanager
def _whole_group(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Stop a step's whole process group unless it finished: an interrupted make (Ctrl-C, a
    test's timeout) would otherwise leave its compilers writing into the tree while the next
    build (which the lock then lets in) resumes there. SIGINT first, as a terminal's Ctrl-C,
    so make deletes the targets it was writing; then SIGKILL for whatever is left."""
    try:
        yield
    finally:
        if proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_GRACE)
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class _StepFailed(Exception):
    def __init__(self, step: str) -> None:
        super().__init__(step)
        self.step = step


def build(source: Source, *, jobs: int | None = None, progress: Progress | None = None,
          force: bool = False) -> tuple[Kernel, bool]:
    """Build the netdevsim kernel from ``source`` unless its key is cached; (kernel, built)."""
    say = progress or (lambda _msg: None)
    check_toolchain()
    fragment, patch = fragment_text(), patch_text()
    key = cache_key(source.package_version, fragment, patch)
    dest = nsim_dir() / key
    jobs = jobs or os.cpu_count() or 1
    with _lock():
        if (dest / BUILD_JSON).is_file() and not force:
            try:
                kernel = Kernel.load(dest, REBUILD)
                kernel.verify()
                return kernel, False
            except BrokenEntry as exc:
                say(f"{exc.message}: building it again")
        # The tree depends on source and patch only: a changed fragment rebuilds incrementally.
        work = nsim_dir() / f".build-{cache_key(source.package_version, '', patch)}"
        tree = work / "linux"
        log = work / "build.log"
        builder = _Builder(tree, log, jobs)
        start = time.monotonic()
        try:
            if not (tree / UNPACKED).is_file():
                say(f"unpacking {source.tarball.name}")
                shutil.rmtree(work, ignore_errors=True)
                tree.mkdir(parents=True)
                builder.step("unpack", ["tar", "-xf", str(source.tarball),
                                        "--strip-components=1"])
                (tree / UNPACKED).touch()
            else:
                say(f"resuming the build in {work}")
            if not (tree / PATCHED).is_file():
                (work / PATCH).write_text(patch)
                builder.step("patch", ["patch", "-p1", "--forward", "--batch"],
                             stdin=work / PATCH)
                (tree / PATCHED).touch()
            say("configuring (tinyconfig + nsim.config)")
            (work / CONFIG_FRAGMENT).write_text(fragment)
            builder.make("tinyconfig", "tinyconfig")
            builder.step("merge_config", ["scripts/kconfig/merge_config.sh", "-m",
                                          ".config", str(work / CONFIG_FRAGMENT)])
            builder.make("olddefconfig", "olddefconfig")
            config = (tree / ".config").read_text()
            if bad := config_mismatches(fragment_options(fragment), config):
                raise ZcnetError("the kernel config lost options of nsim.config (missing "
                                 f"dependencies?): {', '.join(bad)}",
                                 "fix src/zcnet/vm/nsim/nsim.config for this source "
                                 f"({source.package} {source.package_version})")
            say(f"building bzImage with make -j{jobs} (minutes; log: {log})")
            builder.make("bzImage", "bzImage")
        except _StepFailed as exc:
            if exc.step == "unpack":   # the build's first step, on the cached download
                last = _tail(log, 1)
                shutil.rmtree(work, ignore_errors=True)
                raise BrokenEntry(source.tarball.parent, f"{source.tarball.name} does not "
                                  f"unpack ({last})", REBUILD) from None
            kept = nsim_dir() / FAILED_LOG
            shutil.copy(log, kept)
            raise BuildFailed(exc.step, _tail(log), kept) from None
        release = subprocess.run(["make", "-s", "ARCH=x86_64", "kernelrelease"], cwd=tree,
                                 capture_output=True, text=True,
                                 check=False).stdout.strip() or source.version
        with ExitStack() as stack:
            out = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix=f".entry-{key}-", dir=nsim_dir())))
            (out / "modules").mkdir()
            shutil.copy(tree / "arch/x86/boot/bzImage", out / "vmlinuz")
            (out / "config").write_text(config)
            (out / "modules.order").write_text("")
            kernel = Kernel(out, release, release.split("-")[0].split("+")[0],
                            source.package_version, (source.package,), remake=REBUILD)
            kernel.save_meta()
            (out / BUILD_JSON).write_text(json.dumps({
                "key": key, "source_package": source.package,
                "source_package_version": source.package_version,
                "seconds": round(time.monotonic() - start, 1), "jobs": jobs}, indent=1) + "\n")
            if dest.exists():
                shutil.rmtree(dest)
            out.rename(dest)
            out.mkdir()  # for the TemporaryDirectory's own cleanup
        return Kernel.load(dest), True


def nsim_kernel(*, build_if_missing: bool = True, progress: Progress | None = None) -> Kernel:
    """The netdevsim kernel: the cached build if any, else built now (needs network once)."""
    if (hit := find_built()) is not None:
        return hit
    if not build_if_missing:
        raise NoSource("no netdevsim kernel is built for the current config and patch",
                       "run `zcnet vm build-kernel`")
    check_toolchain()
    return build(resolve_source(progress=progress), progress=progress)[0]
