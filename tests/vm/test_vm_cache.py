"""Issue 33: `zcnet vm` with a damaged kernel cache entry or a cache directory it cannot use.

A damaged entry (a truncated or foreign kernel image or module, a missing file, metadata that
is not what zcnet writes) is found before anything boots and named with the fix; `vm fetch`
downloads it again. Entries are made here from small files in the formats a boot reads (a
bzImage setup header, ELF modules), so nothing boots; the test that damages a real Debian
kernel fetches one (network) and is marked slow."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import vmplugin
from refusals import refusal, run_main, run_zcnet
from zcnet.vm import kbuild
from zcnet.vm.kernels import BrokenEntry, Kernel, find_cached, kernels_dir, scan
from zcnet.vm.runner import kvm_verdicts
from zcnet.vm.sources import MIRROR_ENV

RELEASE = "7.3.4+deb13-amd64"
UNREACHABLE = "http://127.0.0.1:9/debian"
needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None
                                or shutil.which("busybox") is None,
                                reason="`vm run` looks for QEMU and busybox before the kernel")


def bzimage(payload: int = 64) -> bytes:
    """A bzImage as far as its setup header goes: one setup sector, ``payload`` bytes after."""
    image = bytearray(1024 + payload)
    image[0x1F1] = 1
    struct.pack_into("<I", image, 0x1F4, payload // 16)
    image[0x202:0x206] = b"HdrS"
    return bytes(image)


def elf_module() -> bytes:
    """A 64-bit ELF file with one (null) section header at the end, as modules have theirs."""
    head = bytearray(64)
    head[:7] = b"\x7fELF\x02\x01\x01"
    struct.pack_into("<QQ", head, 0x20, 0, 64)
    struct.pack_into("<HHHH", head, 0x36, 56, 0, 64, 1)
    return bytes(head) + bytes(64)


def make_entry(where: Path, *, remake: str | None = None) -> Kernel:
    where.mkdir(parents=True)
    (where / "modules").mkdir()
    (where / "vmlinuz").write_bytes(bzimage())
    (where / "config").write_text("CONFIG_IO_URING_ZCRX=y\nCONFIG_VETH=m\n")
    (where / "modules" / "veth.ko").write_bytes(elf_module())
    (where / "modules.order").write_text("veth.ko\n")
    kernel = Kernel(where, RELEASE, "7.3.4", "7.3.4-1", ("linux-image-" + RELEASE,),
                    **({"remake": remake} if remake else {}))
    kernel.save_meta()
    return kernel


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(MIRROR_ENV, UNREACHABLE)
    return tmp_path / "cache" / "zcnet"


@pytest.fixture
def entry(cache: Path) -> Kernel:
    return make_entry(kernels_dir() / RELEASE)


def _meta(kernel: Kernel, change: Callable[[dict], object]) -> None:
    meta = json.loads((kernel.path / "kernel.json").read_text())
    change(meta)
    (kernel.path / "kernel.json").write_text(json.dumps(meta))


def _truncate(path: Path, by: int = 1) -> None:
    os.truncate(path, path.stat().st_size - by)


def _legacy(kernel: Kernel) -> None:
    """An entry made before kernel.json recorded sizes and digests."""
    _meta(kernel, lambda m: m.pop("files"))


# damage -> (what it does to an entry, what the error says)
DAMAGE: dict[str, tuple[Callable[[Kernel], object], str]] = {
    "vmlinuz truncated": (lambda k: _truncate(k.vmlinuz), "vmlinuz is 1087 bytes, 1088 when"),
    "vmlinuz rewritten": (lambda k: k.vmlinuz.write_bytes(bytes(1088)),
                          "vmlinuz changed since the entry was made"),
    "module missing": (lambda k: (k.path / "modules" / "veth.ko").unlink(),
                       "modules/veth.ko is missing"),
    "config missing": (lambda k: k.config_path.unlink(), "config is missing"),
    "modules.order foreign": (lambda k: (k.path / "modules.order").write_text("../../x\n"),
                              "modules.order names '../../x', not a module"),
    "kernel.json not JSON": (lambda k: (k.path / "kernel.json").write_text('{"release": '),
                             "kernel.json is not JSON"),
    "kernel.json binary": (lambda k: (k.path / "kernel.json").write_bytes(b"\xff" * 9),
                           "is not UTF-8 text"),
    "kernel.json a list": (lambda k: (k.path / "kernel.json").write_text("[]"),
                           "kernel.json: not a JSON object"),
    "kernel.json no version": (lambda k: _meta(k, lambda m: m.pop("version")),
                               "kernel.json: no 'version'"),
    "packages a string": (lambda k: _meta(k, lambda m: m.update(packages="linux")),
                          "'packages' is 'linux'"),
    "files outside": (lambda k: _meta(k, lambda m: m["files"].update({"../../etc/passwd":
                                                                     [1, "00"]})),
                      "'files' is not a list of sizes and digests"),
    "kernel.json a FIFO": (lambda k: ((k.path / "kernel.json").unlink(),
                                      os.mkfifo(k.path / "kernel.json")),
                           "kernel.json is a FIFO"),
    "kernel.json missing": (lambda k: (k.path / "kernel.json").unlink(),
                            "kernel.json: No such file"),
    "legacy, vmlinuz truncated": (lambda k: (_legacy(k), _truncate(k.vmlinuz, 10)),
                                  "vmlinuz is truncated: 1078 bytes, its header says 1088"),
    "legacy, vmlinuz foreign": (lambda k: (_legacy(k), k.vmlinuz.write_bytes(b"MZ" * 600)),
                                "vmlinuz is not a kernel image"),
    "legacy, module truncated": (lambda k: (_legacy(k), _truncate(
        k.path / "modules" / "veth.ko", 10)), "veth.ko is truncated"),
    "legacy, module foreign": (lambda k: (_legacy(k), (k.path / "modules" / "veth.ko")
                                          .write_bytes(b"not a module")),
                               "veth.ko is not a 64-bit ELF file"),
    "legacy, vmlinux foreign": (lambda k: (_legacy(k), (k.path / "vmlinux")
                                           .write_bytes(bzimage())),
                                "vmlinux is not a 64-bit ELF file"),
    "legacy, empty config": (lambda k: (_legacy(k), k.config_path.write_text("\n")),
                             "config holds no CONFIG_ option"),
}


def test_a_whole_entry_verifies_and_is_listed(entry: Kernel, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    entry.verify()
    _legacy(entry)
    Kernel.load(entry.path).verify()    # the formats alone say it is whole
    monkeypatch.setenv("PATH", str(tmp_path))   # no QEMU: status says so and goes on
    rc, out, err = run_main("vm", "status")
    assert rc == 0, err
    assert RELEASE in out and "io_uring zcrx" in out


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_entry_is_named_and_not_booted(entry: Kernel, damage: str,
                                               monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    do, says = DAMAGE[damage]
    do(entry)
    fix = f"remove it (rm -r {entry.path}); `zcnet vm fetch` gets the kernel again"
    if shutil.which("qemu-system-x86_64") and shutil.which("busybox"):
        rc, _, err = run_main("vm", "run", "--", "true")
        refusal(rc, err, 1, f"broken cache entry {entry.path}: ", says, fix)
        assert not list(Path("/tmp").glob(f"zcnet-vm-{os.getpid()}-*"))   # no guest was made
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, _, err = run_main("vm", "status")
    refusal(rc, err, 1, entry.path, says, fix)


def test_fetch_passes_over_a_damaged_entry_and_keeps_it_until_replaced(entry: Kernel) -> None:
    _truncate(entry.vmlinuz)
    r = run_zcnet("vm", "fetch", "--kernel", "7.3")
    refusal(r.returncode, r.stderr, 1, f"cannot reach the Debian archive at {UNREACHABLE}")
    assert f"broken cache entry {entry.path}" in r.stderr and "fetching it again" in r.stderr
    assert entry.vmlinuz.stat().st_size == 1087   # still there: nothing replaced it yet


def test_one_damaged_entry_is_not_passed_over_for_another(cache: Path) -> None:
    """`vm run` boots what it is asked for, or says why not: an older whole entry is not taken
    silently in place of a damaged newer one."""
    make_entry(kernels_dir() / "7.2.13+deb14-amd64")
    _meta(Kernel.load(kernels_dir() / "7.2.13+deb14-amd64"),
          lambda m: m.update(release="7.2.13+deb14-amd64", version="7.2.13"))
    newer = make_entry(kernels_dir() / RELEASE)
    (newer.path / "kernel.json").write_text("{")
    good, broken = scan(kernels_dir())
    assert [k.version for k in good] == ["7.2.13"] and [b.path for b in broken] == [newer.path]
    with pytest.raises(BrokenEntry, match=r"kernel\.json is not JSON"):
        find_cached("latest")


# --- what QEMU or the runner refuses ----------------------------------------------------------


@needs_qemu
def test_qemu_refusing_to_start_is_one_line(entry: Kernel) -> None:
    """This entry is whole as far as zcnet checks, but its setup header says boot protocol 0,
    for which QEMU loads no initramfs: QEMU's last words are the reason, no empty console."""
    r = run_zcnet("vm", "run", "--accel", "tcg", "--", "true")
    refusal(r.returncode, r.stderr, 125, "QEMU did not start the guest: qemu: linux kernel too "
            "old to load a ram disk", "fix what QEMU names")
    assert "kernel log" not in r.stderr


@needs_qemu
def test_runner_options_it_cannot_honour(entry: Kernel, tmp_path: Path) -> None:
    rc, _, err = run_main("vm", "run", "--cpus", "256", "--", "true")
    refusal(rc, err, 2, "--cpus 256", "1 to 255")
    gone = tmp_path / "gone"
    gone.mkdir()
    r = run_zcnet("vm", "run", "--", "true", cwd=gone, preexec_fn=gone.rmdir)
    refusal(r.returncode, r.stderr, 2, "the current directory no longer exists", "--share")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    rc, _, err = run_main("vm", "run", "--share", str(loop), "--", "true")
    refusal(rc, err, 2, f"share {loop} cannot be resolved (Symlink loop")


# --- a cache directory that cannot be used ----------------------------------------------------


def _unusable(tmp_path: Path) -> dict[str, tuple[str, ...]]:
    plain = tmp_path / "plain"
    plain.write_text("")
    return {str(plain): (f"{plain} is not a directory",),
            str(plain / "sub"): (f"{plain} is not a directory",),
            "/sys/kernel": ("cannot create the cache directory /sys/kernel/zcnet",
                            "Operation not permitted"),
            str(tmp_path / ("x" * 300)): ("cannot create the cache directory",
                                          "File name too long")}


@pytest.mark.parametrize("argv", [["fetch"], ["run", "--", "true"], ["build-kernel"]])
def test_unusable_cache_dir_is_named_with_the_fix(tmp_path: Path, argv: list[str]) -> None:
    if argv[0] == "build-kernel" and kbuild.missing_tools():
        pytest.skip(f"build-kernel stops earlier: missing {kbuild.missing_tools()}")
    if argv[0] == "run" and not (shutil.which("qemu-system-x86_64") and shutil.which("busybox")):
        pytest.skip("`vm run` stops earlier without QEMU and busybox")
    for where, says in _unusable(tmp_path).items():
        env = dict(os.environ, XDG_CACHE_HOME=where, **{MIRROR_ENV: UNREACHABLE})
        r = run_zcnet("vm", *argv, env=env)
        refusal(r.returncode, r.stderr, 1, *says, "fix: set XDG_CACHE_HOME",
                progress=("no cached kernel matching",))


def test_read_only_cache_dir_is_named_with_the_fix(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    script = (f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && "
              f"XDG_CACHE_HOME={ro} {MIRROR_ENV}={UNREACHABLE} "
              f"exec {sys.executable} -m zcnet vm fetch")
    r = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True,
                       text=True, timeout=60)
    refusal(r.returncode, r.stderr, 1, f"cannot create the cache directory {ro}/zcnet/kernels",
            "Read-only file system", "XDG_CACHE_HOME")


def test_damaged_kvm_verdicts_are_tried_again(cache: Path) -> None:
    verdicts = cache / "kvm-boots.json"
    verdicts.parent.mkdir(parents=True)
    boot = json.dumps(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    verdicts.write_text(json.dumps({f"[{boot}, not json": "", f"[{boot}, 1]": ""}))
    assert kvm_verdicts() == {}
    verdicts.unlink()
    os.mkfifo(verdicts)     # read as "nothing known", without waiting for a writer
    assert kvm_verdicts() == {}


# --- the netdevsim kernel's cache --------------------------------------------------------------


def test_damaged_nsim_entry_says_how_to_build_it_again(cache: Path) -> None:
    key = kbuild.cache_key("7.3.4-1", kbuild.fragment_text(), kbuild.patch_text())
    kernel = make_entry(kbuild.nsim_dir() / key, remake=kbuild.REBUILD)
    (kernel.path / kbuild.BUILD_JSON).write_text(json.dumps({"source_package_version":
                                                             "7.3.4-1"}))
    assert kbuild.find_built() == kernel
    _truncate(kernel.vmlinuz)
    with pytest.raises(BrokenEntry, match="`zcnet vm build-kernel` builds it again"):
        kbuild.find_built().verify()
    (kernel.path / kbuild.BUILD_JSON).write_text("[")
    with pytest.raises(BrokenEntry, match=r"build\.json is not JSON"):
        kbuild.find_built()


def test_damaged_source_tarball_is_passed_over(cache: Path) -> None:
    src = kbuild.nsim_dir() / "src" / "7.3.4-1"
    src.mkdir(parents=True)
    tarball = src / "linux-source-7.3.tar.xz"
    tarball.write_bytes(b"\xfd7zXZ\x00" + bytes(4096))
    (src / "source.json").write_text(json.dumps({
        "package": "linux-source-7.3", "package_version": "7.3.4-1", "tarball": tarball.name,
        "files": {tarball.name: [tarball.stat().st_size, "0" * 64]}}))
    assert kbuild._cached_sources() == []   # the digest differs: to be downloaded again
    meta = json.loads((src / "source.json").read_text())
    meta.pop("files")
    meta["tarball"] = "../../../etc/passwd"
    (src / "source.json").write_text(json.dumps(meta))
    assert kbuild._cached_sources() == []   # a path out of the cache is not followed


# --- a real kernel ------------------------------------------------------------------------------


@pytest.mark.slow
@needs_qemu
def test_damaged_debian_kernel_is_refused_then_fetched_again(tmp_path: Path) -> None:
    try:
        real = vmplugin.vm_kernel()
    except vmplugin.cannot_boot() as exc:
        pytest.skip(f"no Debian kernel: {exc}")
    copy = tmp_path / "cache" / "zcnet" / "kernels" / real.path.name
    shutil.copytree(real.path, copy)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    Kernel.load(copy).verify()
    victim = copy / ("vmlinux" if (copy / "vmlinux").exists() else "vmlinuz")
    _truncate(victim, victim.stat().st_size // 2)
    r = run_zcnet("vm", "run", "--", "true", env=env)
    refusal(r.returncode, r.stderr, 1, f"broken cache entry {copy}", f"{victim.name} is")
    r = run_zcnet("vm", "fetch", "--kernel", real.release, env=env, timeout=600)
    if r.returncode and "cannot reach the Debian archive" in r.stderr:
        pytest.skip("the archive is unreachable: the damaged entry cannot be fetched again")
    assert r.returncode == 0, r.stderr
    assert "fetching it again" in r.stderr and f"fetched {real.release}" in r.stdout
    Kernel.load(copy).verify()
