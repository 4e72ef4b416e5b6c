"""Booting a cached kernel under QEMU and running one command in it.

``VM`` holds what one guest run needs (QEMU found, accelerator chosen, a private temp directory
with the initramfs); ``VM.run(argv)`` boots, runs ``argv`` as root inside with this process's
environment, streams the guest's output and returns the command's exit status. Every run boots
afresh; ``run_in_vm`` is the one-shot form.

Some facts that shape it:

- Output travels on a virtio console that QEMU writes to its stdout; a thread here copies it to
  the caller's stream and keeps the last lines. The kernel's own log goes to the serial port,
  into ``console.log`` in the temp directory, so a panic or hang can be shown without mixing
  kernel messages into the command's output.
- The exit status comes back as a file on the control share (9p, read-write, the temp
  directory); its absence means the guest died before the command finished (panic, OOM, kill).
- QEMU runs in its own session, so a terminal's Ctrl-C reaches only us; we kill QEMU while
  unwinding. ``PR_SET_PDEATHSIG`` kills it if this process dies without unwinding (SIGKILL).
  SIGTERM/SIGHUP become ``SystemExit`` while a run is in progress on the main thread, so they
  unwind too. The temp directory is removed on every path.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from zcnet.errors import UsageError, ZcnetError
from zcnet.lab.names import pid_alive
from zcnet.userfile import FileProblem, read_text
from zcnet.vm import initramfs
from zcnet.vm.accel import Accel, choose_accel
from zcnet.vm.child import pdeathsig
from zcnet.vm.kernels import Kernel, cache_root

QEMU = "qemu-system-x86_64"
IN_VM_ENV = "ZCNET_IN_VM"
HOST_RELEASE_ENV = "ZCNET_VM_HOST_RELEASE"   # the host's ``uname -r``, for the guest to compare
# How much longer than on the host zcnet's start-up timeouts may take in the guest (read by
# zcnet.bench.remote, which must not import this package): under TCG every Python process starts
# ten to forty times slower than on the host.
TIMEOUT_SCALE_ENV = "ZCNET_TIMEOUT_SCALE"
TCG_TIMEOUT_SCALE = 10
DEFAULT_CPUS = 2
MAX_CPUS = 255        # QEMU's default machine (pc, i440FX) takes no more
DEFAULT_MEM = "2G"
DEFAULT_TIMEOUT = 600.0
TAIL_LINES = 25
# Less work for an emulated CPU: no mitigations, no crypto self-tests, no zeroing of every
# kernel allocation, no lockup or TSC watchdogs (a busy host stalls vCPUs; the TSC watchdog would
# then switch to an emulated clocksource that makes every clock read slow).
KERNEL_CMDLINE = ("console=ttyS0 loglevel=4 panic=-1 rdinit=/init 8250.nr_uarts=1 "
                  "mitigations=off random.trust_cpu=on i8042.noaux i8042.nokbd "
                  "cryptomgr.notests init_on_alloc=0 nowatchdog tsc=reliable")
TMP_PREFIX = "zcnet-vm-"  # then the runner's pid: its temp dir is swept once that pid is gone
# Session-specific variables that mean nothing inside the guest.
_ENV_DROP = frozenset({"DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS",
                       "SSH_AUTH_SOCK", "SSH_AGENT_PID", "TMPDIR", "PWD", "OLDPWD", "SHLVL", "_",
                       "INVOCATION_ID", "JOURNAL_STREAM", "NOTIFY_SOCKET"})


def sweep_dead_runs(root: Path | None = None) -> list[Path]:
    """Remove the temp dirs of runs whose process is gone: one killed with SIGKILL unwinds
    nothing (its QEMU dies with it, PR_SET_PDEATHSIG, but its initramfs and logs stay)."""
    swept = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{TMP_PREFIX}*-*"):
        m = re.fullmatch(rf"{TMP_PREFIX}(\d+)-.+", path.name)
        if m and path.is_dir() and not pid_alive(int(m[1])):
            shutil.rmtree(path, ignore_errors=True)
            swept.append(path)
    return swept


class NoQemu(ZcnetError):
    def __init__(self) -> None:
        super().__init__(f"{QEMU} not found on PATH: `zcnet vm` needs QEMU",
                         "apt-get install qemu-system-x86")


class VMTimeout(ZcnetError):
    exit_code = 124

    def __init__(self, seconds: float, tail: str) -> None:
        super().__init__(f"the guest did not finish within {seconds:g} s and was killed; "
                         f"last lines of its console:\n{tail or '(nothing)'}",
                         "raise --timeout, or look for a hang in the lines above")


class VMCrashed(ZcnetError):
    exit_code = 125

    def __init__(self, why: str, tail: str, *, while_booting: bool = False) -> None:
        #: The kernel crashed before the command started (run() boots once more).
        self.while_booting = while_booting
        if not tail:   # nothing came out: QEMU itself refused (its last words are the reason)
            super().__init__(f"QEMU did not start the guest: {why.splitlines()[-1]}",
                             "fix what QEMU names: --cpus, --mem, --accel or the kernel")
            return
        super().__init__(f"the guest ended without the command's exit status ({why}); "
                         f"last lines of its console:\n{tail}",
                         "see the kernel messages above; `zcnet vm status` lists kernels")


class VMClosed(ZcnetError):
    def __init__(self) -> None:
        super().__init__("this VM was closed", "create a new VM to run another command")


@dataclass(frozen=True)
class RunResult:
    returncode: int
    seconds: float
    accel: str


#: Seconds a kernel gets to start its first command under KVM before KVM is taken as unusable
#: for it (it takes 1-3 s where KVM works, and about as long under TCG).
KVM_BOOT_CHECK = 30.0


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _verdicts_path() -> Path:
    return cache_root() / "kvm-boots.json"


def kvm_verdicts() -> dict[str, str]:
    """Whether KVM started each kernel tried on this host ("" yes, else why not), keyed by
    host boot, QEMU and kernel image: a new boot or a rebuilt kernel is tried again."""
    try:
        got = json.loads(read_text(_verdicts_path(), "cache file", limit=1 << 20, fix=""))
    except (FileProblem, ValueError, RecursionError):   # none yet, or damaged: tried again
        return {}
    if not isinstance(got, dict):
        return {}
    boot = json.dumps(_boot_id())
    return {k: v for k, v in got.items()
            if isinstance(v, str) and k.startswith(f"[{boot},") and _verdict_key(k)}


def _verdict_key(key: str) -> bool:
    """A key as ``VM._kvm_or_tcg`` writes it: [boot id, QEMU, image, mtime]."""
    try:
        parts = json.loads(key)
    except ValueError:
        return False
    return isinstance(parts, list) and len(parts) == 4


def save_kvm_verdicts(verdicts: dict[str, str]) -> None:
    path = _verdicts_path()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(verdicts))
        tmp.replace(path)
    except OSError:  # a read-only or full cache: the check runs again next time
        tmp.unlink(missing_ok=True)


def find_qemu() -> str:
    path = shutil.which(QEMU)
    if path is None:
        raise NoQemu
    return path


def parse_mem(text: str) -> str:
    """``2G``, ``1536M``, ``2048`` (MiB) -> QEMU's form; a UsageError otherwise."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in "MG" else (t, "M")
    try:
        value = int(num)
    except ValueError:
        raise UsageError(f"bad memory size {text!r}", "give e.g. 2G or 1536M") from None
    mib = value * (1024 if unit == "G" else 1)
    if not 128 <= mib <= 1024 * 1024:
        raise UsageError(f"memory size {text!r} out of range", "between 128M and 1024G")
    return f"{mib}M"


def guest_env(env: Mapping[str, str], accel: str = "kvm") -> dict[str, str]:
    """The caller's environment for the guest. ``python`` there is this interpreter: version
    shims (pyenv's are shell scripts that exec a dozen processes) cost seconds each over 9p.
    Under TCG start-up timeouts are scaled (``TIMEOUT_SCALE_ENV``) unless the caller set that."""
    out = {k: v for k, v in env.items() if k not in _ENV_DROP and k.isidentifier()}
    if accel == "tcg":
        out.setdefault(TIMEOUT_SCALE_ENV, str(TCG_TIMEOUT_SCALE))
    here = os.path.dirname(sys.executable)
    out["PATH"] = os.pathsep.join([here, *(p for p in out.get("PATH", os.defpath).split(
        os.pathsep) if p != here)])
    out[IN_VM_ENV] = "1"
    out[HOST_RELEASE_ENV] = os.uname().release
    return out


def command_script(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> str:
    lines = ["set -e"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    lines += [f"cd {shlex.quote(str(cwd))}", "set +e", f"exec {shlex.join(argv)}", ""]
    return "\n".join(lines)


_CRASHES = ("Kernel panic", "BUG:", "Oops:")  # the kernel itself failed
_ALARMS = (*_CRASHES, "general protection fault", "Out of memory")


def _tail(data: bytes, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines; from the first panic/oops line on if that is nearer the end."""
    text = data.decode(errors="replace").replace("\r", "").rstrip("\n").splitlines()
    alarm = next((i for i, line in enumerate(text) if any(a in line for a in _ALARMS)), None)
    start = len(text) - lines if alarm is None else max(alarm - 2, len(text) - 2 * lines)
    return "\n".join(text[max(start, 0):]) or "(nothing)"


@contextmanager
def _signals_unwind() -> Iterator[None]:
    """SIGTERM/SIGHUP raise SystemExit(128+sig) during the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    prior = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in prior.items():
            signal.signal(s, h)


class _Pump(threading.Thread):
    """Copies QEMU's stdout (the guest console) to ``sink``; keeps the last bytes."""

    def __init__(self, stream: BinaryIO, sink: Callable[[bytes], None] | None) -> None:
        super().__init__(name="zcnet-vm-output", daemon=True)
        self.stream, self.sink = stream, sink
        self.tail: collections.deque[bytes] = collections.deque(maxlen=64)
        self.first_output: float | None = None
        self.error: OSError | None = None   # the sink failed (a closed pipe): raised later

    def run(self) -> None:
        # Keep draining after a sink error: a full pipe would stall the guest.
        while chunk := os.read(self.stream.fileno(), 65536):
            if self.first_output is None:
                self.first_output = time.monotonic()
            self.tail.append(chunk)
            if self.sink is not None:
                try:
                    self.sink(chunk)
                except OSError as exc:
                    self.error, self.sink = exc, None

    def text(self) -> bytes:
        return b"".join(self.tail)


def stream_sink(stream: BinaryIO) -> Callable[[bytes], None]:
    def write(chunk: bytes) -> None:
        stream.write(chunk)
        stream.flush()
    return write


class VM:
    """A kernel ready to boot; ``run`` boots it once per command. Use as a context manager."""

    def __init__(self, kernel: Kernel, *, cpus: int = DEFAULT_CPUS, mem: str = DEFAULT_MEM,
                 timeout: float = DEFAULT_TIMEOUT, share: Path | None = None,
                 accel: str = "auto") -> None:
        if not 1 <= cpus <= MAX_CPUS:
            raise UsageError(f"--cpus {cpus}: QEMU's machine takes 1 to {MAX_CPUS} CPUs",
                             f"give --cpus from 1 to {MAX_CPUS}")
        if timeout <= 0:
            raise UsageError(f"--timeout must be positive, got {timeout}")
        if accel not in ("auto", "kvm", "tcg"):
            raise UsageError(f"unknown accelerator {accel!r}", "auto, kvm or tcg")
        self.kernel, self.cpus, self.mem, self.timeout = kernel, cpus, parse_mem(mem), timeout
        if share is None:
            try:
                share = Path.cwd()
            except FileNotFoundError:   # getcwd() of a directory removed since
                raise UsageError("the current directory no longer exists",
                                 "cd to a directory that exists, or pass --share DIR") from None
        try:
            self.share = share.resolve()
        except (OSError, RuntimeError) as exc:   # RuntimeError: a symlink loop
            raise UsageError(f"share {share} cannot be resolved ({exc})",
                             "give a directory") from None
        if not self.share.is_dir():
            raise UsageError(f"share {self.share} is not a directory")
        if self.share == Path("/") or self.share.is_relative_to("/run"):
            raise UsageError(f"cannot share {self.share} read-write: the guest needs its own "
                             "/ and /run", "share (or run from) another directory")
        self.qemu = find_qemu()
        busybox = initramfs.find_busybox()
        kernel.verify()   # a damaged entry boots into failures that point nowhere near it
        self.accel: Accel = choose_accel(self.qemu, accel)
        self._stack = ExitStack()
        with ExitStack() as setup:
            setup.push(self._stack)
            sweep_dead_runs()
            self._tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
            self._stack.callback(shutil.rmtree, self._tmp, ignore_errors=True)
            self._initrd = self._tmp / "initramfs.cpio"
            initramfs.build(kernel.modules, busybox, self._initrd)
            self._closed = False
            if accel == "auto" and self.accel.name == "kvm":
                self.accel = self._kvm_or_tcg()
            setup.pop_all()

    def _kvm_or_tcg(self) -> Accel:
        """KVM if this kernel starts a command under it, else TCG: a host has been seen whose
        KVM runs the probe's boot sector but hangs a Linux guest for good (QEMU spinning in
        the host kernel, nothing on the console). Known per kernel image for this host boot
        (kvm_verdicts), so the boot is tried once, not per run."""
        image = Path(self.kernel.boot_image)
        key = json.dumps([_boot_id(), self.qemu, str(image), image.stat().st_mtime_ns])
        verdicts = kvm_verdicts()
        if key not in verdicts:
            saved, self.timeout = self.timeout, KVM_BOOT_CHECK
            try:
                r = self._boot_and_run(["true"], None, self.share, None, time.monotonic())
                verdicts[key] = "" if r.returncode == 0 else f"`true` exited {r.returncode}"
            except VMTimeout:  # the hang seen: kept for this host boot
                verdicts[key] = (f"this kernel did not start a command within "
                                 f"{KVM_BOOT_CHECK:.0f} s under KVM")
            except VMCrashed as exc:  # maybe not KVM's doing (memory, QEMU): this VM only
                return Accel("tcg", f"KVM unusable this time ({exc.args[0]})")
            finally:
                self.timeout = saved
            save_kvm_verdicts(verdicts)
        why = verdicts[key]
        return self.accel if not why else Accel("tcg", f"KVM unusable ({why})")

    def __enter__(self) -> VM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._stack.close()

    def _qemu_argv(self, ctl: Path, console_log: Path) -> list[str]:
        passthrough = "passthrough" if os.geteuid() == 0 else "none"
        fs = [("host", Path("/"), "none", True), ("work", self.share, passthrough, False),
              ("ctl", ctl, passthrough, False)]
        argv = [self.qemu, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
                *self.accel.qemu_args, "-smp", str(self.cpus), "-m", self.mem,
                "-kernel", str(self.kernel.boot_image), "-initrd", str(self._initrd),
                "-append", KERNEL_CMDLINE,
                "-serial", f"file:{console_log}",
                "-chardev", "stdio,id=out,signal=off",
                "-device", "virtio-serial-pci", "-device", "virtconsole,chardev=out"]
        for tag, path, model, ro in fs:
            opts = f"local,id={tag},path={path},security_model={model},multidevs=remap"
            argv += ["-fsdev", opts + (",readonly=on" if ro else ""),
                     "-device", f"virtio-9p-pci,fsdev={tag},mount_tag={tag}"]
        return argv

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            cwd: Path | None = None, output: Callable[[bytes], None] | None = None) -> RunResult:
        """Boot, run ``argv`` in ``cwd`` (default: the share), return its exit status.

        ``output`` receives the guest's console bytes as they come (None: discard)."""
        if self._closed:
            raise VMClosed
        if not argv:
            raise UsageError("no command to run in the VM", "give one after --")
        cwd = (cwd or self.share).resolve()
        if cwd.is_relative_to("/run"):
            raise UsageError(f"the guest has its own /run, so {cwd} does not exist there",
                             "run from another directory")
        start = time.monotonic()
        try:
            return self._boot_and_run(argv, env, cwd, output, start)
        except VMCrashed as exc:
            if not exc.while_booting:
                raise
        # Under TCG a guest kernel has been seen to oops while booting (an int3 trap during
        # early text patching): the emulation's fault, not the command's, which never started.
        # One more boot; a second crash is reported as it is.
        sys.stderr.write("zcnet vm: the guest kernel crashed while booting; booting it again\n")
        return self._boot_and_run(argv, env, cwd, output, start)

    def _boot_and_run(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: Path,
                      output: Callable[[bytes], None] | None, start: float) -> RunResult:
        with ExitStack() as stack:
            ctl = Path(tempfile.mkdtemp(prefix="run-", dir=self._tmp))
            stack.callback(shutil.rmtree, ctl, ignore_errors=True)
            (ctl / initramfs.WORK_PATH).write_text(f"{self.share}\n")
            (ctl / initramfs.CMD_SCRIPT).write_text(
                command_script(argv, guest_env(os.environ if env is None else env, self.accel.name),
                               cwd))
            console_log = self._tmp / f"{ctl.name}.console.log"
            stack.callback(console_log.unlink, missing_ok=True)
            qemu_err = stack.enter_context(open(self._tmp / f"{ctl.name}.qemu.log", "w+b"))
            stack.callback(Path(qemu_err.name).unlink, missing_ok=True)
            stack.enter_context(_signals_unwind())
            proc = subprocess.Popen(self._qemu_argv(ctl, console_log), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=qemu_err,
                                    start_new_session=True,
                                    preexec_fn=pdeathsig(signal.SIGKILL))
            assert proc.stdout is not None
            pump = _Pump(proc.stdout, output)
            stack.callback(self._stop, proc, pump)
            pump.start()
            try:
                status = proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self._stop(proc, pump)
                raise VMTimeout(self.timeout, self._tails(pump, console_log)) from None
            pump.join(5)
            if pump.error is not None:
                raise pump.error
            rc_file = ctl / initramfs.RC_FILE
            if rc_file.is_file() and (text := rc_file.read_text().strip()).isdigit():
                return RunResult(int(text), time.monotonic() - start, self.accel.name)
            err = ctl / "error"
            qemu_said = Path(qemu_err.name).read_bytes()
            why = (err.read_text().strip() if err.is_file()
                   else _tail(qemu_said, 3) if status != 0 and qemu_said.strip()
                   else f"QEMU exited with status {status}")
            kernel = console_log.read_bytes() if console_log.is_file() else b""
            booting = (not (ctl / initramfs.STARTED_FILE).exists() and not err.is_file()
                       and any(a.encode() in kernel for a in _CRASHES))
            raise VMCrashed(why, self._tails(pump, console_log), while_booting=booting)

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes], pump: _Pump) -> None:
        """Kill QEMU if it runs, reap it, let the pump read to EOF, then close the pipe."""
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if pump.ident is not None:
            pump.join(5)
        if proc.stdout is not None and not pump.is_alive():
            proc.stdout.close()

    @staticmethod
    def _tails(pump: _Pump, console_log: Path) -> str:
        """The ends of the kernel log and of the command's output; "" if both are empty."""
        kernel = console_log.read_bytes() if console_log.is_file() else b""
        if not kernel.strip() and not pump.text().strip():
            return ""
        return (f"--- kernel log (serial) ---\n{_tail(kernel)}\n"
                f"--- command output ---\n{_tail(pump.text(), 10)}")


def run_in_vm(argv: Sequence[str], kernel: Kernel, *, output: Callable[[bytes], None] | None = None,
              env: Mapping[str, str] | None = None, cwd: Path | None = None,
              **vm_options: object) -> RunResult:
    """Boot ``kernel`` once, run ``argv`` inside, return its result (see ``VM``)."""
    with VM(kernel, **vm_options) as vm:  # type: ignore[arg-type]
        return vm.run(argv, env=env, cwd=cwd, output=output)
