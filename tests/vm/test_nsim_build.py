"""The netdevsim test kernel's build recipe: fragment, patch, cache key, failures (host side)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from zcnet.errors import ZcnetError
from zcnet.vm import kbuild
from zcnet.vm.archive import Apt, ArchiveUnreachable
from zcnet.vm.sources import Mirror


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "zcnet" / "nsim"


def test_fragment_asks_for_what_the_issue_needs():
    opts = kbuild.fragment_options(kbuild.fragment_text())
    for name in ("NETDEVSIM", "UDMABUF", "IO_URING", "IO_URING_ZCRX", "NET_DEVMEM", "NET_NS",
                 "VETH", "ETHTOOL_NETLINK", "PAGE_POOL_STATS", "NET_9P_VIRTIO", "9P_FS",
                 "OVERLAY_FS", "DEVTMPFS", "SERIAL_8250_CONSOLE", "VIRTIO_CONSOLE", "ACPI",
                 "SMP", "64BIT", "XPS", "HUGETLBFS"):
        assert opts.get(f"CONFIG_{name}") == "y", name
    assert opts["CONFIG_MODULES"] == "n"  # everything built in: the initramfs loads nothing


def test_patch_says_it_is_scaffolding_and_touches_every_pool():
    patch = kbuild.patch_text()
    assert "NOT upstream behaviour" in patch
    assert "+\tnsim_bus_dev->dev.dma_mask = &nsim_bus_dev->dev.coherent_dma_mask;" in patch
    assert "PP_FLAG_ALLOW_UNREADABLE_NETMEM" in patch and "DMA_FROM_DEVICE" in patch
    # The pool helper and its three callers (probe, and both queue-restart modes), each with
    # the queue's config (its rx_page_size).
    assert patch.count("dev, idx, qcfg);") == 2
    assert "+\t\terr = nsim_create_page_pool(&rq->page_pool, &rq->napi, dev, i," in patch
    # The datapath hooks: RX split into the pool, TX read of unreadable frags, steering.
    for hook in ("skb = nsim_rx_dma(ns, rq, skb);", "skb = nsim_tx_dma(dev, skb);",
                 "rxq = nsim_steer_rxq(peer_ns, skb, rxq);",
                 "dev->netmem_tx = NETMEM_TX_DMA;", ".supported_params\t= QCFG_RX_PAGE_SIZE,"):
        assert f"+\t{hook}" in patch or f"+\t\t{hook}" in patch, hook


def test_config_mismatch_names_dropped_options():
    wanted = {"CONFIG_NETDEVSIM": "y", "CONFIG_MODULES": "n", "CONFIG_NR_CPUS": "8"}
    config = "CONFIG_NR_CPUS=8\n# CONFIG_NETDEVSIM is not set\nCONFIG_MODULES=y\n"
    assert kbuild.config_mismatches(wanted, config) == [
        "CONFIG_NETDEVSIM=y (got n)", "CONFIG_MODULES=n (got y)"]
    assert kbuild.config_mismatches(wanted, "CONFIG_NETDEVSIM=y\nCONFIG_NR_CPUS=8\n") == []


def test_cache_key_covers_source_fragment_and_patch():
    base = kbuild.cache_key("7.3.4-1", "A", "P")
    assert base == kbuild.cache_key("7.3.4-1", "A", "P")
    assert len({base, kbuild.cache_key("7.3.5-1", "A", "P"), kbuild.cache_key("7.3.4-1", "B", "P"),
                kbuild.cache_key("7.3.4-1", "A", "Q")}) == 4


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(kbuild.NoToolchain) as ei:
        kbuild.check_toolchain()
    assert "gcc" in ei.value.message and "apt-get install" in (ei.value.hint or "")
    assert "build-essential" in ei.value.hint


def _fake_source(cache: Path, body: dict[str, bytes]) -> kbuild.Source:
    """A linux-source-like tarball holding only BODY (so the patch cannot apply)."""
    src = cache / "src" / "0.0-test"
    src.mkdir(parents=True)
    tar = src / "linux-source-7.9.tar.xz"
    with tarfile.open(tar, "w:xz") as tf:
        for name, data in body.items():
            info = tarfile.TarInfo(f"linux-source-7.9/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return kbuild.Source("linux-source-7.9", "0.0-test", tar)


class ScriptedApt(Apt):
    """The real ``Apt`` with its one boundary, running apt-get/apt-cache (with the private
    configuration), answered from a script:
    an archive offering ``linux-source-7.9`` (and an older one) as the real .deb ``deb``."""

    def __init__(self, state: Path, deb: Path, reachable: bool = True) -> None:
        super().__init__(Mirror("http://archive.invalid/debian", None), state)
        self.deb, self.reachable = deb, reachable
        self.calls: list[tuple[str, ...]] = []

    def _run(self, tool: str, *args: str,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        cmd = (tool, *args)
        self.calls.append(cmd)
        out, rc = "", 0
        if not self.reachable:
            out, rc = "E: Failed to fetch http://archive.invalid/debian", 100
        elif cmd[1:] == ("pkgnames", "linux-source-"):
            out = "linux-source-6.12\nlinux-source-7.9\n"
        elif cmd[1:] == ("show", "--no-all-versions", "linux-source-7.9"):
            out = "Package: linux-source-7.9\nVersion: 7.9.1-1\n"
        elif cmd[-2:] == ("download", "linux-source-7.9"):
            assert cwd is not None
            shutil.copy(self.deb, cwd)
        elif cmd[-1] != "update":
            raise AssertionError(f"unexpected apt call {cmd}")
        return subprocess.CompletedProcess([tool, *args], rc, out, out if rc else "")


def _source_deb(tmp_path: Path, tarball: bytes) -> Path:
    """A real linux-source-7.9 package carrying ``tarball`` where Debian puts it."""
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: linux-source-7.9\nVersion: 7.9.1-1\nArchitecture: all\n"
        "Maintainer: zcnet tests <tests@example.invalid>\nDescription: test source\n")
    (root / "usr/src").mkdir(parents=True)
    (root / "usr/src/linux-source-7.9.tar.xz").write_bytes(tarball)
    deb = tmp_path / "linux-source-7.9_7.9.1-1_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(root), str(deb)], check=True,
                   capture_output=True)
    return deb


def test_resolve_source_on_a_fresh_machine_downloads_once_then_reuses(cache, tmp_path):
    """From an empty cache root (no zcnet cache directory at all): the newest source >= 7.2 is
    downloaded, unpacked into the cache, then reused without a download; with the archive gone
    the cached one is used."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("no dpkg-deb")
    payload = os.urandom(4096)
    deb = _source_deb(tmp_path, payload)
    assert not cache.parent.exists()
    apt = ScriptedApt(tmp_path / "apt", deb)
    src = kbuild.resolve_source(apt=apt)
    assert (src.package, src.package_version, src.version) == ("linux-source-7.9", "7.9.1-1", "7.9")
    assert src.tarball == cache / "src" / "7.9.1-1" / "linux-source-7.9.tar.xz"
    assert src.tarball.read_bytes() == payload
    assert sorted(p.name for p in cache.iterdir()) == ["src"]   # no temp dir left behind
    assert sum(c[-2:] == ("download", "linux-source-7.9") for c in apt.calls) == 1
    again = ScriptedApt(tmp_path / "apt", deb)
    assert kbuild.resolve_source(apt=again) == src
    assert not any("download" in c for c in again.calls)
    offline = ScriptedApt(tmp_path / "apt", deb, reachable=False)
    assert kbuild.resolve_source(apt=offline) == src


def test_resolve_source_offline_with_nothing_cached_names_the_archive(cache, tmp_path):
    offline = ScriptedApt(tmp_path / "apt", tmp_path / "none.deb", reachable=False)
    with pytest.raises(ArchiveUnreachable, match=r"archive\.invalid") as ei:
        kbuild.resolve_source(apt=offline)
    assert "ZCNET_VM_MIRROR" in (ei.value.hint or "")


def test_failed_build_shows_the_log_and_leaves_no_entry(cache):
    if kbuild.missing_tools():
        pytest.skip(f"no toolchain: {', '.join(kbuild.missing_tools())}")
    source = _fake_source(cache, {"Makefile": b"all:\n"})
    with pytest.raises(kbuild.BuildFailed) as ei:
        kbuild.build(source)
    text = ei.value.message
    assert "failed at patch" in text and "drivers/net/netdevsim" in text
    assert (cache / kbuild.FAILED_LOG).is_file()
    assert kbuild.built_kernels() == [] and kbuild.find_built() is None
    entries = [p for p in cache.iterdir() if not p.name.startswith(".")
               and p.name not in ("src", kbuild.FAILED_LOG)]
    assert entries == []
    # Not poisoned: the same key is attempted again (and fails the same way), not "cached".
    with pytest.raises(kbuild.BuildFailed):
        kbuild.build(source)


def test_run_kernel_nsim_without_a_build_names_the_fix(cache, monkeypatch):
    with pytest.raises(ZcnetError, match="no netdevsim kernel is built"):
        kbuild.nsim_kernel(build_if_missing=False)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a cold build takes 5-16 min on 2 shared vCPUs (the default is 300 s)
def test_build_kernel_cli_builds_once_then_reports_cached():
    """The real recipe against Debian's newest linux-source >= 7.2 (minutes when cold)."""
    if kbuild.missing_tools():
        pytest.skip(f"no toolchain: {', '.join(kbuild.missing_tools())}")
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "zcnet", "vm", "build-kernel"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if first.returncode != 0 and ("cannot reach the Debian archive" in first.stderr
                                  or "offers no linux-source" in first.stderr):
        pytest.skip(first.stderr.strip().splitlines()[-1])
    assert first.returncode == 0, first.stderr
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "already built" in again.stdout, again.stdout
    kernel = kbuild.find_built()
    assert kernel is not None and kernel.vmlinuz.is_file() and kernel.modules == []
    config = kernel.config()
    assert config["CONFIG_NETDEVSIM"] == "y" and config["CONFIG_PAGE_POOL_STATS"] == "y"
    meta = json.loads((kernel.path / kbuild.BUILD_JSON).read_text())
    assert kernel.path.name == kbuild.cache_key(meta["source_package_version"],
                                                kbuild.fragment_text(), kbuild.patch_text())


def test_an_interrupted_step_stops_its_whole_process_group(tmp_path, monkeypatch):
    """Ctrl-C (or a test's timeout) while make runs: its children must not keep writing into
    the tree that the next build resumes (seen: two builds interleaved in one tree)."""
    pidfile = tmp_path / "child.pid"
    real_wait = subprocess.Popen.wait

    def interrupted(self, timeout=None):  # type: ignore[no-untyped-def]
        if timeout is None and not hasattr(self, "_interrupted"):  # the step's own wait
            self._interrupted = True
            for _ in range(500):
                if pidfile.is_file() and pidfile.read_text().strip():
                    break
                time.sleep(0.01)
            raise KeyboardInterrupt
        return real_wait(self, timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", interrupted)
    builder = kbuild._Builder(tmp_path, tmp_path / "build.log", 1)
    # A grandchild that ignores SIGINT, as a background job of a non-interactive shell does.
    with pytest.raises(KeyboardInterrupt):
        builder.step("compile", ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"])
    child = int(pidfile.read_text())
    for _ in range(100):
        if not Path(f"/proc/{child}").exists():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists(), "the step's grandchild outlived the interrupt"


def test_a_step_ends_when_the_builder_is_killed(tmp_path):
    """The builder SIGKILLed (a test runner's timeout kills `zcnet vm build-kernel` so): its
    make gets SIGTERM from the kernel (PR_SET_PDEATHSIG), never orphaned to go on building."""
    pidfile = tmp_path / "make.pid"
    code = ("import sys; from pathlib import Path; from zcnet.vm import kbuild\n"
            f"b = kbuild._Builder(Path({str(tmp_path)!r}), Path({str(tmp_path)!r}) / 'log', 1)\n"
            f"b.step('compile', ['sh', '-c', 'echo $$ > {pidfile}; exec sleep 300'])\n")
    builder = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(500):
            if pidfile.is_file() and pidfile.read_text().strip():
                break
            time.sleep(0.01)
        step = int(pidfile.read_text())
        assert Path(f"/proc/{step}").exists()
    finally:
        builder.kill()
        builder.wait()
    for _ in range(100):
        if not Path(f"/proc/{step}").exists():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{step}").exists(), "the step outlived its killed builder"
