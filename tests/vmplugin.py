"""Tests marked ``vm`` run inside one VM per session, under a kernel >= 7.2.

On the host (outer run) each ``vm`` item is replaced by a stand-in that, when the first one runs,
boots one VM running ``pytest`` on all selected ``vm`` items, then reports each one's inner
outcome: passed, failed with the inner failure text, or skipped with the inner reason. If the VM
cannot boot (no QEMU, no kernel and no archive) every ``vm`` item skips naming why; an item with
no inner result fails, so no ``vm`` test passes without having run inside. Inside the VM
(``ZCNET_IN_VM=1``) the items run normally and each report is appended to the JSON-lines file
named by ``ZCNET_VM_RESULTS`` on the read-write share.

``@pytest.mark.vm(kernel="nsim")`` items run in a second VM, under zcnet's netdevsim test kernel
(built on first use by ``zcnet.vm.kbuild``; they skip naming why when it cannot be built).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from zcnet.vm.runner import IN_VM_ENV

if TYPE_CHECKING:
    from zcnet.vm.kernels import Kernel

RESULTS_ENV = "ZCNET_VM_RESULTS"
KERNEL_ENV = "ZCNET_VM_KERNEL"        # which kernel the outer run boots (default: newest)
BATCH_TIMEOUT = float(os.environ.get("ZCNET_VM_TIMEOUT", "900"))
IN_VM = os.environ.get(IN_VM_ENV) == "1"
# The inner run loads only the plugins it uses: no entry-point plugins (scanning every installed
# distribution's metadata, and importing hypothesis's, pytest-asyncio's and the benchmark's
# plugins, costs seconds over 9p under TCG; no vm test uses them), pytest-timeout by name, and
# no cache (it would be written to the read-only root).
# Temp dirs on the guest's own tmpfs: under /tmp pytest would list (and prune) the host's
# pytest-of-* directories through the overlay.
INNER_OPTIONS = ("--disable-plugin-autoload", "-p", "pytest_timeout", "-p", "no:cacheprovider",
                 "--basetemp=/run/zcnet-pytest")


# Modules whose setup is slow under TCG run at the end of a batch, so results start streaming
# sooner: the BTF check's `bpftool btf dump` of vmlinux plus its parse take ~7 s in the guest.
SLOW_SETUP = ("tests/uapi/test_uapi_btf.py::",)


def inner_argv(nodeids: list[str], timeout: float = BATCH_TIMEOUT) -> list[str]:
    """The pytest command the VM runs for a batch (benchmarks/vm_boot.py times this same one)."""
    ordered = sorted(nodeids, key=lambda n: n.startswith(SLOW_SETUP))  # stable: order kept
    return [sys.executable, "-m", "pytest", "-q", "-m", "vm", *INNER_OPTIONS,
            f"--timeout={timeout:.0f}", *ordered]


def cannot_boot() -> tuple[type[Exception], ...]:
    """The errors meaning the VM cannot boot on this machine: skip, naming the reason, rather
    than fail. Imported here, not at the top: the run inside the VM needs none of this."""
    from zcnet.vm.archive import ArchiveUnreachable, NoSuchKernel
    from zcnet.vm.initramfs import MissingBusybox
    from zcnet.vm.kbuild import NoSource, NoToolchain
    from zcnet.vm.runner import NoQemu

    return (NoQemu, MissingBusybox, ArchiveUnreachable, NoSuchKernel, NoToolchain, NoSource)


def vm_kernel(name: str | None = None) -> Kernel:
    """The kernel vm tests boot: cached, else fetched (raises one of cannot_boot() if
    impossible); ``nsim``: the netdevsim test kernel, built if not cached."""
    from zcnet.vm.archive import fetch
    from zcnet.vm.kbuild import NSIM, nsim_kernel
    from zcnet.vm.kernels import find_cached

    if name == NSIM:
        return nsim_kernel()
    wanted = os.environ.get(KERNEL_ENV, "latest")
    return find_cached(wanted) or fetch(wanted)[0]


class InnerFailure(Exception):
    pass


@dataclass
class Batch:
    """The one VM run of a session and what it reported."""

    nodeids: list[str]
    kernel: str | None = None         # None: the default kernel; "nsim": the netdevsim kernel
    done: bool = False
    skip_reason: str | None = None
    error: str | None = None          # the run itself failed (crash, timeout, exit status)
    reports: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def run(self, rootdir: Path) -> None:
        from zcnet.errors import ZcnetError
        from zcnet.vm.kbuild import BuildFailed
        from zcnet.vm.runner import run_in_vm

        self.done = True
        cannot = cannot_boot()
        try:
            kernel = vm_kernel(self.kernel)
        except cannot as exc:
            self.skip_reason = f"cannot boot a VM: {exc}"
            return
        except BuildFailed as exc:
            self.error = exc.message
            return
        with tempfile.TemporaryDirectory(prefix="zcnet-vmtests-") as share:
            results = Path(share) / "results.jsonl"
            env = dict(os.environ, **{RESULTS_ENV: str(results)})
            argv = inner_argv(self.nodeids)
            log = Path(share) / "console.txt"
            with open(log, "wb") as out:
                try:
                    result = run_in_vm(argv, kernel, output=out.write, env=env, cwd=rootdir,
                                       share=Path(share), timeout=BATCH_TIMEOUT)
                    if result.returncode not in (0, 1):
                        self.error = f"inner pytest exited {result.returncode}"
                except cannot as exc:
                    self.skip_reason = f"cannot boot a VM: {exc}"
                except ZcnetError as exc:
                    self.error = exc.message
            tail = log.read_bytes().decode(errors="replace").splitlines()[-30:]
            if self.error:
                self.error += "\n--- inner output ---\n" + "\n".join(tail)
            if results.is_file():
                for line in results.read_text().splitlines():
                    rep = json.loads(line)
                    self.reports.setdefault(rep["nodeid"], []).append(rep)

    def outcome(self, nodeid: str) -> None:
        if self.skip_reason:
            pytest.skip(self.skip_reason)
        reps = self.reports.get(nodeid)
        if not reps:
            raise InnerFailure(f"did not run inside the VM: {self.error or 'no inner result'}")
        for rep in reps:
            if rep["outcome"] == "failed":
                raise InnerFailure(f"inside the VM ({rep['when']}):\n{rep['longrepr']}")
        for rep in reps:
            if rep["outcome"] == "skipped":
                pytest.skip(f"inside the VM: {rep['longrepr']}")
        if not any(r["when"] == "call" and r["outcome"] == "passed" for r in reps):
            raise InnerFailure(f"no passing call reported inside the VM: {reps}")


_BATCH = pytest.StashKey[dict[str | None, Batch]]()


def kernel_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("vm")
    return marker.kwargs.get("kernel") if marker else None


class VMItem(pytest.Item):
    """Stands in on the host for a ``vm`` test; reports its outcome inside the VM."""

    def __init__(self, *, original: pytest.Item, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.original_nodeid = original.nodeid
        self._location = original.location
        self.own_markers = [*original.own_markers, pytest.mark.timeout(BATCH_TIMEOUT + 120).mark]
        self.keywords.update(original.keywords)

    def runtest(self) -> None:
        batch = self.session.stash[_BATCH][kernel_of(self)]
        if not batch.done:
            batch.run(self.config.rootpath)
        batch.outcome(self.original_nodeid)

    def reportinfo(self) -> tuple[os.PathLike[str] | str, int | None, str]:
        return self._location[0], self._location[1], self._location[2]

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: str | None = None) -> str:
        if isinstance(excinfo.value, InnerFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))


def collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the host, swap each ``vm`` item for a stand-in (run before ``-m`` deselection)."""
    if IN_VM:
        return
    for i, item in enumerate(items):
        if item.get_closest_marker("vm") and not isinstance(item, VMItem):
            items[i] = VMItem.from_parent(item.parent, name=item.name, original=item)


def collection_finish(session: pytest.Session) -> None:
    batches: dict[str | None, Batch] = {}
    for item in session.items:
        if isinstance(item, VMItem):
            kernel = kernel_of(item)
            batches.setdefault(kernel, Batch([], kernel)).nodeids.append(item.original_nodeid)
    session.stash[_BATCH] = session.config.stash[_BATCH] = batches


def runtest_logreport(report: pytest.TestReport) -> None:
    """Inside the VM: record each phase's outcome for the host (the inner run has only vm tests)."""
    path = os.environ.get(RESULTS_ENV)
    if not IN_VM or not path:
        return
    longrepr = (report.longrepr[2].removeprefix("Skipped: ")
                if isinstance(report.longrepr, tuple) else report.longreprtext)
    with open(path, "a") as fh:
        fh.write(json.dumps({"nodeid": report.nodeid, "when": report.when,
                             "outcome": report.outcome, "longrepr": str(longrepr),
                             "duration": report.duration}) + "\n")


def terminal_summary(config: pytest.Config, write: Callable[[str], None],
                     slowest: int = 8) -> None:
    """On the host: each VM batch's slowest inner tests (setup + call + teardown), since the
    host's own durations see one item that booted the VM and ran them all."""
    for kernel, batch in config.stash.get(_BATCH, {}).items():
        took = {n: sum(r.get("duration", 0.0) for r in reps) for n, reps in batch.reports.items()}
        if not took:
            continue
        write(f"vm batch ({kernel or 'default kernel'}): {sum(took.values()):.0f} s in "
              f"{len(took)} tests; slowest inside the VM:")
        for n, t in sorted(took.items(), key=lambda kv: -kv[1])[:slowest]:
            write(f"  {t:7.1f}s {n}")
