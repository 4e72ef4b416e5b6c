"""The netdevsim test kernel's build recipe: fragment, patch, cache key, failures (host side)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from zcnet.errors import ZcnetError
from zcnet.vm import kbuild


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "zcnet" / "nsim"


def test_fragment_asks_for_what_the_issue_needs():
    opts = kbuild.fragment_options(kbuild.fragment_text())
    for name in ("NETDEVSIM", "UDMABUF", "IO_URING", "IO_URING_ZCRX", "NET_DEVMEM", "NET_NS",
                 "VETH", "ETHTOOL_NETLINK", "PAGE_POOL_STATS", "NET_9P_VIRTIO", "9P_FS",
                 "OVERLAY_FS", "DEVTMPFS", "SERIAL_8250_CONSOLE", "VIRTIO_CONSOLE", "ACPI",
                 "SMP", "64BIT", "XPS"):
        assert opts.get(f"CONFIG_{name}") == "y", name
    assert opts["CONFIG_MODULES"] == "n"  # everything built in: the initramfs loads nothing


def test_patch_says_it_is_scaffolding_and_touches_every_pool():
    patch = kbuild.patch_text()
    assert "NOT upstream behaviour" in patch
    assert "+\tnsim_bus_dev->dev.dma_mask = &nsim_bus_dev->dev.coherent_dma_mask;" in patch
    assert "PP_FLAG_ALLOW_UNREADABLE_NETMEM" in patch and "DMA_FROM_DEVICE" in patch
    # The pool helper and its three callers (probe, and both queue-restart modes).
    assert patch.count("+\t\t\t\t    dev, idx);") + patch.count("+\t\t\t\t\t     dev, idx);") == 2
    assert "nsim_create_page_pool(&rq->page_pool, &rq->napi, dev, i)" in patch


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
