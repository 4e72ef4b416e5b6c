"""`zcnet vm` on the host: fetching, the runner's exits (status, timeout, panic, signals) and its
failure messages. Tests that boot a guest need QEMU and a kernel (cached or fetched); without
them they skip with the reason."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import vmplugin
from zcnet.bench import remote
from zcnet.errors import UsageError, ZcnetError
from zcnet.vm import archive, bootimage, initramfs, runner
from zcnet.vm.accel import Accel, choose_accel, probe_kvm
from zcnet.vm.archive import Candidate, NoSuchKernel, choose, packages_for
from zcnet.vm.kernels import Kernel
from zcnet.vm.runner import (
    TCG_TIMEOUT_SCALE,
    TIMEOUT_SCALE_ENV,
    VM,
    VMClosed,
    VMCrashed,
    command_script,
    find_qemu,
    guest_env,
    parse_mem,
    run_in_vm,
)
from zcnet.vm.sources import MIRROR_ENV, system_mirror

UNREACHABLE = "http://127.0.0.1:9/debian"  # loopback, nothing listens on the discard port


def _leftovers(pid: int) -> list[str]:
    """Temp dirs and QEMU processes of the zcnet process ``pid`` that still exist."""
    tag = f"zcnet-vm-{pid}-"
    left = [str(p) for p in Path(tempfile.gettempdir()).glob(f"{tag}*")]
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if proc.name.isdigit() and tag.encode() in cmdline and b"qemu" in cmdline:
            left.append(f"qemu pid {proc.name}")
    return left


def _default_sigint() -> None:
    # A shell's background job starts with SIGINT ignored, and exec keeps that; the test needs
    # the disposition a terminal gives.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _zcnet(*args: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.Popen[str]:
    env = dict(env or os.environ)
    if "PYTHONPATH" in env:  # absolute, so that a test may change the directory
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p)
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    return subprocess.Popen([sys.executable, "-m", "zcnet", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, preexec_fn=_default_sigint,
                            **kw)  # type: ignore[call-overload]


def _finish(proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    deadline = time.monotonic() + 5
    while _leftovers(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers(proc.pid) == []
    assert "Traceback" not in err, err
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def kernel() -> Kernel:
    try:
        find_qemu()
        initramfs.find_busybox()
        return vmplugin.vm_kernel()
    except vmplugin.cannot_boot() as exc:
        pytest.skip(f"cannot boot a VM: {exc}")


# -- no guest needed ---------------------------------------------------------------------------


def test_newc_archive_reads_back_with_cpio(tmp_path: Path) -> None:
    data = initramfs.newc([("dir", 0o40755, b"", (0, 0)), ("dir/f", 0o100644, b"abc", (0, 0)),
                           ("console", 0o20600, b"", (5, 1))])
    if not (cpio := shutil.which("cpio")):
        pytest.skip("cpio not installed (apt-get install cpio)")
    listing = subprocess.run([cpio, "-itv"], input=data, capture_output=True, check=True)
    lines = listing.stdout.decode().splitlines()
    assert [ln.split()[-1] for ln in lines] == ["dir", "dir/f", "console"]
    assert lines[2].startswith("crw") and "5," in lines[2]
    subprocess.run([cpio, "-id", "--quiet"], input=data, cwd=tmp_path, check=True)
    assert (tmp_path / "dir/f").read_bytes() == b"abc"


def test_command_script_keeps_arguments_and_environment(tmp_path: Path) -> None:
    argv = ["sh", "-c", 'printf "%s|" "$@" "$TOKEN"', "x", "a b", "it's", '"q"', "$HOME", ""]
    script = tmp_path / "cmd.sh"
    script.write_text(command_script(argv, {"TOKEN": "v'al \"ue\"", "PATH": os.environ["PATH"]},
                                     tmp_path))
    out = subprocess.run(["/bin/sh", str(script)], capture_output=True, text=True, env={},
                         check=True).stdout
    assert out == "a b|it's|\"q\"|$HOME||v'al \"ue\"|"


def test_guest_environment() -> None:
    env = guest_env({"PATH": "/usr/bin:/bin", "DISPLAY": ":0", "PYTHONPATH": "/x/src", "A": "1"})
    here = os.path.dirname(sys.executable)
    assert env["PATH"] == f"{here}:/usr/bin:/bin"
    assert env["PYTHONPATH"] == "/x/src" and env["A"] == "1" and "DISPLAY" not in env
    assert env["ZCNET_IN_VM"] == "1" and env["ZCNET_VM_HOST_RELEASE"] == os.uname().release
    assert TIMEOUT_SCALE_ENV not in env


def test_tcg_guest_scales_server_start_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under TCG the guest's environment stretches zcnet.bench.remote's start timeout; a value
    the caller set wins; a bad one is a clear error."""
    assert TIMEOUT_SCALE_ENV == remote.TIMEOUT_SCALE_ENV
    tcg = guest_env({"PATH": "/bin"}, "tcg")
    assert guest_env({"PATH": "/bin", TIMEOUT_SCALE_ENV: "3"}, "tcg")[TIMEOUT_SCALE_ENV] == "3"
    monkeypatch.delenv(TIMEOUT_SCALE_ENV, raising=False)
    assert remote.start_timeout() == remote.START_TIMEOUT
    monkeypatch.setenv(TIMEOUT_SCALE_ENV, tcg[TIMEOUT_SCALE_ENV])
    assert remote.start_timeout() == remote.START_TIMEOUT * TCG_TIMEOUT_SCALE
    for bad in ("0.5", "ten", "nan", "inf"):
        monkeypatch.setenv(TIMEOUT_SCALE_ENV, bad)
        with pytest.raises(UsageError, match=TIMEOUT_SCALE_ENV):
            remote.start_timeout()


def test_system_sources_both_formats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb http://sec.example/debian-security bookworm-security main\n")
    (tmp_path / "sources.list.d/debian.sources").write_text(
        "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://archive.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /nonexistent.gpg\n")
    assert system_mirror(tmp_path).uri == "http://archive.example/debian"
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://one.example/debian sid main\n")
    assert system_mirror(tmp_path).uri == "http://one.example/debian"
    monkeypatch.setenv(MIRROR_ENV, UNREACHABLE)
    assert system_mirror(tmp_path).uri == UNREACHABLE


def test_kernel_choice_is_resolved_not_pinned() -> None:
    names = ["linux-image-7.3.4+deb13-amd64", "linux-image-7.3.4+deb13-cloud-amd64",
             "linux-image-7.3.4+deb13-amd64-dbg", "linux-image-7.2.13+deb14-rt-amd64",
             "linux-image-6.1.0-18-amd64", "linux-image-amd64"]
    assert [n for n in names if archive._IMAGE.match(n)] == [
        "linux-image-7.3.4+deb13-amd64", "linux-image-6.1.0-18-amd64"]
    deps = ("linux-base-7.2.13+deb14-amd64", "linux-binary-7.2.13+deb14-amd64",
            "linux-modules-7.2.13+deb14-amd64", "initramfs-tools", "kmod")
    cands = [Candidate("linux-image-7.3.4+deb13-amd64", "7.3.4+deb13", "7.3.4", "1", ()),
             Candidate("linux-image-7.2.13+deb14-amd64", "7.2.13+deb14", "7.2.13", "1", deps),
             Candidate("linux-image-7.2.6+deb13-amd64", "7.2.6+deb13", "7.2.6", "1", ())]
    assert choose(cands, "latest").version == "7.3.4"
    assert choose(cands, "7.2").version == "7.2.13"
    assert choose(cands, "7.2.6+deb13-amd64").version == "7.2.6"
    assert packages_for(cands[1]) == ["linux-image-7.2.13+deb14-amd64", *deps[:3]]
    # A version the archive dropped: the newest offered one, not a failure.
    assert choose(cands, "7.2.12").version == "7.3.4"
    with pytest.raises(NoSuchKernel, match=r">= 7\.2"):
        choose([], "latest")


def test_memory_sizes() -> None:
    assert [parse_mem(m) for m in ("2G", "1536M", "512", "1GiB")] == [
        "2048M", "1536M", "512M", "1024M"]
    for bad in ("lots", "1K", "64M"):
        with pytest.raises(ZcnetError):
            parse_mem(bad)


def test_kvm_probe_falls_back_to_tcg(tmp_path: Path) -> None:
    """A KVM that cannot run a guest (here: a QEMU that aborts) means TCG, with the reason."""
    works, seen = probe_kvm("qemu-system-x86_64", device=tmp_path / "no-kvm")
    assert not works and "cannot open" in seen
    fake = tmp_path / "qemu-fake"
    fake.write_text("#!/bin/sh\necho 'kvm_buf_set_msrs: Assertion failed' >&2\nexit 134\n")
    fake.chmod(0o755)
    accel = choose_accel(str(fake))
    assert accel.name == "tcg" and accel.qemu_args == ["-accel", "tcg", "-cpu", "max"]
    if Path("/dev/kvm").exists() and os.access("/dev/kvm", os.R_OK | os.W_OK):
        assert "Assertion failed" in accel.reason
    else:
        assert "cannot open" in accel.reason


def test_missing_qemu_is_named_with_the_fix(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path))
    for args in (("vm", "run", "--", "true"), ("vm", "status")):
        rc, out, err = _finish(_zcnet(*args, env=env))
        text = out + err
        assert "qemu-system-x86_64" in text and "apt-get install qemu-system-x86" in text
        if args[1] == "run":
            assert rc == 1


def test_unreachable_archive_is_named(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), **{MIRROR_ENV: UNREACHABLE})
    # A fetch killed before its cleanup left its work directory: the next fetch removes it.
    stale = tmp_path / "zcnet" / "kernels" / ".fetch-killed"
    (stale / "debs").mkdir(parents=True)
    (stale / "debs" / "linux-image.deb").write_bytes(b"x" * 4096)
    for args in (("vm", "fetch"), ("vm", "run", "--", "true")):
        rc, _, err = _finish(_zcnet(*args, env=env), timeout=120)
        assert rc == 1
        assert f"cannot reach the Debian archive at {UNREACHABLE}" in err
        assert "fix:" in err
        assert not stale.exists()


@pytest.mark.parametrize("spec", ["nope", "7.2;true", "", "latest7", "7..2"])
def test_kernel_that_names_nothing_is_refused_before_any_fetch(tmp_path: Path, spec: str) -> None:
    # A typo must not fall through to "the archive's newest" (choose's rule for a real version
    # the archive dropped) and boot a kernel nobody asked for.
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), **{MIRROR_ENV: UNREACHABLE})
    for args in (("fetch", "--kernel", spec), ("run", "--kernel", spec, "--", "true")):
        rc, _, err = _finish(_zcnet("vm", *args, env=env), timeout=60)
        assert rc == 2, err
        assert f"{spec!r} names no kernel" in err and "Traceback" not in err
        assert "Debian archive" not in err


def test_vmlinux_with_pvh_entry_comes_out_of_the_bzimage(kernel: Kernel, tmp_path: Path) -> None:
    out = tmp_path / "vmlinux"
    if not bootimage.extract_vmlinux(kernel.vmlinuz, out):
        pytest.skip(f"no PVH vmlinux in {kernel.release} (zstd missing?)")
    elf = out.read_bytes()
    assert bootimage.has_pvh_entry(elf) and len(elf) > kernel.vmlinuz.stat().st_size
    fake = tmp_path / "fake"
    fake.write_bytes(b"junk" + gzip.compress(b"\x7fELF not really an ELF"))
    assert not bootimage.extract_vmlinux(fake, tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_vm_refuses_bad_use_and_use_after_close(kernel: Kernel, no_leaks) -> None:
    for share in (Path("/"), Path("/run")):
        with pytest.raises(ZcnetError, match="cannot share"):
            VM(kernel, share=share)
    vm = VM(kernel, timeout=60)
    tmp = vm._tmp
    assert (tmp / "initramfs.cpio").is_file()
    with pytest.raises(ZcnetError, match="its own /run"):
        vm.run(["true"], cwd=Path("/run"))
    vm.close()
    assert not tmp.exists()
    with pytest.raises(VMClosed, match="closed"):
        vm.run(["true"])
    vm.close()



def test_kvm_that_does_not_start_this_kernel_means_tcg(kernel: Kernel, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The boot-sector probe can pass on a host whose KVM then hangs a Linux guest (seen
    here: nothing on the console, QEMU spinning): with ``auto`` the kernel itself must start a
    command under KVM first, or the VM runs on TCG, with the reason. The verdict is kept for
    the host's boot, so the next VM does not try again; a kernel that starts keeps KVM."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(runner, "choose_accel", lambda qemu, wanted: Accel("kvm", "probe ran"))
    tries: list[str] = []

    def hangs(self: VM, argv: list[str], *rest: object) -> object:
        tries.append(self.accel.name)
        raise runner.VMTimeout(self.timeout, "(nothing)")

    monkeypatch.setattr(VM, "_boot_and_run", hangs)
    for _ in range(2):
        with VM(kernel) as vm:
            assert vm.accel.name == "tcg" and vm.timeout == runner.DEFAULT_TIMEOUT
            assert "did not start a command within 30 s under KVM" in vm.accel.reason
    assert tries == ["kvm"]  # once: the second VM read the verdict
    with VM(kernel, accel="kvm") as vm:  # asked for: taken as given, not tried
        assert vm.accel.name == "kvm" and tries == ["kvm"]

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))

    def starts(self: VM, argv: list[str], *rest: object) -> runner.RunResult:
        tries.append(self.accel.name)
        return runner.RunResult(0, 1.0, self.accel.name)

    monkeypatch.setattr(VM, "_boot_and_run", starts)
    with VM(kernel) as vm:
        assert vm.accel.name == "kvm" and vm.accel.reason == "probe ran"
    assert tries == ["kvm", "kvm"]

    # A crash may not be KVM's doing (memory, QEMU): TCG this time, tried again next time.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "third"))

    def crashes(self: VM, argv: list[str], *rest: object) -> object:
        tries.append(self.accel.name)
        raise VMCrashed("cannot set up guest memory", "(nothing)")

    monkeypatch.setattr(VM, "_boot_and_run", crashes)
    for _ in range(2):
        with VM(kernel) as vm:
            assert vm.accel.name == "tcg" and "cannot set up guest memory" in vm.accel.reason
    assert tries == ["kvm", "kvm", "kvm", "kvm"]

# -- booting a guest -----------------------------------------------------------------------------


@pytest.mark.slow
def test_run_streams_output_and_returns_status(kernel: Kernel, no_leaks) -> None:
    chunks: list[bytes] = []
    result = run_in_vm(["sh", "-c", "echo hello from $(uname -r); exit 3"], kernel,
                       output=chunks.append, timeout=300)
    assert result.returncode == 3 and result.accel in ("kvm", "tcg")
    assert f"hello from {kernel.release}" in b"".join(chunks).decode()


@pytest.mark.slow
def test_cli_exit_status_env_and_share(kernel: Kernel, tmp_path: Path) -> None:
    env = dict(os.environ, ZCNET_TEST_TOKEN="tok'en 1")
    share = tmp_path / "a share"   # the guest's /init once split the path at the space
    share.mkdir()
    script = 'echo "$ZCNET_TEST_TOKEN $ZCNET_IN_VM $(pwd)" > out.txt; echo done; exit 7'
    rc, out, _ = _finish(_zcnet("vm", "run", "--kernel", kernel.release, "--", "sh", "-c", script,
                                env=env, cwd=share))
    assert rc == 7 and "done" in out
    assert (share / "out.txt").read_text() == f"tok'en 1 1 {share}\n"


@pytest.mark.slow
def test_timeout_kills_guest_and_shows_last_lines(kernel: Kernel) -> None:
    # The guest boots in 3-4 s here (TCG); 20 s leaves five times that for a loaded machine
    # without making every run wait as long as the old 120 s did.
    rc, _, err = _finish(_zcnet("vm", "run", "--timeout", "20", "--", "sh", "-c",
                                "echo about to hang; sleep 1000"))
    assert rc == 124
    assert "did not finish within 20 s" in err and "about to hang" in err


@pytest.mark.slow
def test_guest_panic_is_reported_with_the_kernel_log(kernel: Kernel) -> None:
    # The command started, so its crash is reported at once: no second boot.
    rc, _, err = _finish(_zcnet("vm", "run", "--", "sh", "-c", "echo c > /proc/sysrq-trigger"))
    assert rc == 125
    assert "without the command's exit status" in err and "Kernel panic" in err
    assert "booting it again" not in err


@pytest.mark.slow
def test_a_kernel_crash_while_booting_gets_one_more_boot(kernel: Kernel, monkeypatch, capsys,
                                                          tmp_path: Path) -> None:
    """A kernel that panics before the command starts (here: no init to run, every time) is
    booted once more, then reported; the command never ran."""
    monkeypatch.setattr(runner, "KERNEL_CMDLINE", runner.KERNEL_CMDLINE.replace(
        "rdinit=/init", "rdinit=/nonexistent init=/nonexistent"))
    marker = tmp_path / "ran"
    with VM(kernel, share=tmp_path, timeout=120) as vm, pytest.raises(VMCrashed) as crash:
        vm.run(["touch", str(marker)])
    assert crash.value.while_booting and "Kernel panic" in str(crash.value)
    assert capsys.readouterr().err.count("crashed while booting; booting it again") == 1
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_leaves_nothing_behind(kernel: Kernel, sig: signal.Signals) -> None:
    proc = _zcnet("vm", "run", "--", "sh", "-c", "echo started; sleep 1000")
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    if first != "started":  # say why the guest did not start, not just that it did not
        proc.kill()
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"vm run printed {first!r} first, exit status {proc.returncode}; "
                    f"stderr: {err[-3000:]}")
    assert _leftovers(proc.pid), "the guest should be running"
    proc.send_signal(sig)
    rc, _, _ = _finish(proc, timeout=60)
    assert rc == 128 + sig


STREAM = ("import socket, threading\n"
          "ls = socket.create_server(('127.0.0.1', 0)); port = ls.getsockname()[1]\n"
          "def sink():\n"
          "    c, _ = ls.accept()\n"
          "    while c.recv(1 << 20): pass\n"
          "threading.Thread(target=sink, daemon=True).start()\n"
          "s = socket.create_connection(('127.0.0.1', port)); block = bytes(1 << 20)\n"
          "print('streaming', flush=True)\n"
          "while True: s.sendall(block)\n")


def _streaming_guest() -> subprocess.Popen[str]:
    proc = _zcnet("vm", "run", "--", sys.executable, "-c", STREAM)
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    if first != "streaming":
        proc.kill()
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"the guest printed {first!r}, exit status {proc.returncode}: {err[-3000:]}")
    return proc


def _qemu_pids(runner_pid: int) -> list[int]:
    return [int(p.split()[-1]) for p in _leftovers(runner_pid) if p.startswith("qemu pid")]


def test_sweep_removes_only_the_temp_dirs_of_runs_that_are_gone(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f"{runner.TMP_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{runner.TMP_PREFIX}{os.getpid()}-def"
    other = tmp_path / f"{runner.TMP_PREFIX}output"  # not a run's: no pid in the name
    for d in (dead, live, other):
        d.mkdir()
    (dead / "initramfs.cpio").write_bytes(b"x")
    assert runner.sweep_dead_runs(tmp_path) == [dead]
    assert not dead.exists() and live.is_dir() and other.is_dir()


@pytest.mark.slow
def test_a_guest_killed_mid_stream_leaves_nothing_and_the_next_run_works(kernel: Kernel) -> None:
    """QEMU killed while the guest streams: the run ends saying so (125), nothing is left.
    Then the run itself SIGKILLed mid-stream (no cleanup runs): its QEMU dies with it, and the
    next VM's start removes what the dead run left in $TMPDIR."""
    proc = _streaming_guest()
    (qemu,) = _qemu_pids(proc.pid)
    os.kill(qemu, signal.SIGKILL)
    rc, _, err = _finish(proc, timeout=60)
    assert rc == 125 and "without the command's exit status" in err
    # The next run works (and streams): this time the runner itself dies.
    proc = _streaming_guest()
    (qemu,) = _qemu_pids(proc.pid)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{qemu}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{qemu}").exists(), "QEMU outlived its killed runner"
    left = _leftovers(proc.pid)
    assert left and all("qemu" not in p for p in left)  # only the dead run's temp dir
    assert set(map(str, runner.sweep_dead_runs())) >= set(left)
    assert _leftovers(proc.pid) == []
