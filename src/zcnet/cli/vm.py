"""`zcnet vm fetch|run|status`: run zcnet under a kernel the host does not run."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zcnet.cli._args import Subparsers, positive
from zcnet.errors import UsageError
from zcnet.vm.accel import choose_accel
from zcnet.vm.archive import fetch
from zcnet.vm.caps import capabilities
from zcnet.vm.kbuild import NSIM, build, nsim_kernel, resolve_source
from zcnet.vm.kernels import BrokenEntry, Kernel, find_cached, kernels_dir, scan
from zcnet.vm.runner import (
    DEFAULT_CPUS,
    DEFAULT_MEM,
    DEFAULT_TIMEOUT,
    QEMU,
    VM,
    NoQemu,
    find_qemu,
    kvm_verdicts,
    stream_sink,
)

#: ``latest``, a version prefix (7, 7.2, 7.2.13) or a release as uname -r prints it.
_KERNEL = re.compile(r"latest|\d+(\.\d+){0,2}|\d+\.\d+(\.\d+)?[+~-][\w.+~-]+")


def kernel_spec(*extra: str) -> Callable[[str], str]:
    """An argparse type for --kernel: a name that can match a kernel (or one of ``extra``).
    A typo must not fall through to the archive's newest kernel, which ``choose`` takes for a
    well-formed version the archive no longer offers."""
    def parse(text: str) -> str:
        if text in extra or _KERNEL.fullmatch(text):
            return text
        forms = ", ".join(("latest", *extra, "a version such as 7.2", "a release such as "
                           "7.3.4+deb13-amd64"))
        raise argparse.ArgumentTypeError(f"{text!r} names no kernel; give {forms}")
    return parse


def register(sub: Subparsers) -> None:
    parser = sub.add_parser("vm", help="boot a newer kernel in QEMU and run commands there",
                            description="Fetch Debian kernels >= 7.2 and run commands under them "
                                        "in QEMU, with the host's filesystem visible.")
    actions = parser.add_subparsers(dest="vm_action", metavar="ACTION", required=True)

    fetch_p = actions.add_parser("fetch", help="download a kernel into the cache")
    fetch_p.add_argument("--kernel", default="latest", metavar="VERSION", type=kernel_spec(),
                         help="latest (default), a version prefix such as 7.2, or a release")
    fetch_p.set_defaults(func=_fetch)

    run = actions.add_parser("run", help="boot a cached kernel and run CMD inside as root",
                             description="Boots the kernel with the host's / read-only, the "
                                         "current directory (or --share) read-write, runs CMD "
                                         "with this environment and returns its exit status.")
    run.add_argument("--kernel", default=None, metavar="VERSION", type=kernel_spec(NSIM),
                     help="the newest cached kernel by default (fetched if none is cached); "
                          "nsim: the netdevsim test kernel (built if not cached)")
    run.add_argument("--cpus", type=positive(int), default=DEFAULT_CPUS)
    run.add_argument("--mem", default=DEFAULT_MEM, help="guest memory, e.g. 2G or 1536M")
    run.add_argument("--timeout", type=positive(float), default=DEFAULT_TIMEOUT,
                     metavar="S", help="kill the guest after S seconds")
    run.add_argument("--share", default=None, metavar="DIR",
                     help="read-write directory (default: the current directory)")
    run.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...")
    run.set_defaults(func=_run)

    kbuild = actions.add_parser("build-kernel", help="build the netdevsim test kernel (cached)",
                                description="Builds a small kernel from Debian's newest "
                                            "linux-source >= 7.2 with netdevsim (patched to take "
                                            "zcrx/devmem memory providers), udmabuf and zcrx "
                                            "built in; `vm run --kernel nsim` boots it.")
    kbuild.add_argument("--jobs", type=positive(int), default=None,
                        help="make -j (default: the number of CPUs)")
    kbuild.add_argument("--force", action="store_true", help="rebuild even if cached")
    kbuild.set_defaults(func=_build_kernel)

    status = actions.add_parser("status", help="cached kernels, KVM, what each kernel offers")
    status.set_defaults(func=_status)


def _kernel_for(wanted: str | None, err: Console) -> Kernel:
    if wanted == NSIM:
        return nsim_kernel(progress=err.print)
    kernel = find_cached(wanted or "latest")
    if kernel is not None:
        return kernel
    err.print(f"no cached kernel matching {wanted or 'any'}: fetching one")
    kernel, _ = fetch(wanted or "latest")
    return kernel


def _fetch(args: argparse.Namespace) -> int:
    kernel, downloaded = fetch(args.kernel)
    verb = "fetched" if downloaded else "already cached:"
    Console().print(f"{verb} {kernel.release} ({kernel.package_version}) in {kernel.path}")
    return 0


def _build_kernel(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    kernel, built = build(resolve_source(progress=err.print), jobs=args.jobs,
                          progress=err.print, force=args.force)
    verb = "built" if built else "already built:"
    Console().print(f"{verb} {kernel.release} (from linux-source {kernel.package_version}) "
                    f"in {kernel.path}")
    return 0


def _run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("no command given", "zcnet vm run -- CMD [ARGS...]")
    err = Console(stderr=True)
    find_qemu()
    kernel = _kernel_for(args.kernel, err)
    share = Path(args.share) if args.share else None
    with VM(kernel, cpus=args.cpus, mem=args.mem, timeout=args.timeout, share=share,
            accel=args.accel) as vm:
        result = vm.run(cmd, output=stream_sink(sys.stdout.buffer))
    return result.returncode


def _status(args: argparse.Namespace) -> int:
    console = Console()
    try:
        qemu = find_qemu()
    except NoQemu as exc:
        console.print(f"QEMU: missing ({QEMU}); fix: {exc.hint}")
        qemu = None
    if qemu is not None:
        accel = choose_accel(qemu)
        console.print(f"QEMU: {qemu}; accelerator: {accel.name} ({accel.reason})")
        for key, why in kvm_verdicts().items():  # what booting a kernel under KVM showed
            _, used, image, _ = json.loads(key)
            if used != qemu:
                continue
            console.print(f"  KVM with {image}: "
                          + ("starts it" if not why else f"TCG instead, {why}"), markup=False)
    kernels, broken = scan(kernels_dir())
    for kernel in list(kernels):
        try:
            kernel.verify()
        except BrokenEntry as exc:
            kernels.remove(kernel)
            broken.append(exc)
    for exc in broken:   # said as errors, and the status says so
        print(f"zcnet: error: {exc.message}\nzcnet: fix: {exc.hint}", file=sys.stderr)
    if not kernels:
        console.print(f"no {'whole ' if broken else ''}cached kernels in {kernels_dir()}; "
                      "`zcnet vm fetch` gets one")
        return 1 if broken else 0
    table = Table(title=f"cached kernels in {kernels_dir()}")
    table.add_column("capability")
    for kernel in kernels:
        table.add_column(f"{kernel.release}\n{kernel.package_version}")
    table.add_column("from")
    rows = [capabilities(k) for k in kernels]
    for i, cap in enumerate(rows[0]):
        source = ("kernel config: " if cap.source == "config" else "inferred from version: ")
        source += cap.detail
        table.add_row(cap.name, *("yes" if r[i].available else "no" for r in rows), source)
    console.print(table)
    return 1 if broken else 0
