"""How long `zcnet vm run` takes to show output, and how long the vm-marked tests take.

Each step runs `python -m zcnet vm run ...` (or pytest) as a fresh process and times it from
launch. "First test" runs the very pytest command the vm plugin runs inside the VM
(``vmplugin.inner_argv``) on the same vm tests the outer run would batch for the default kernel,
and times the first byte of its output (the first test's progress mark). Peers in the same run:
the same Python commands on the host, for the guest/host ratio. The machine's load average is
printed too: TCG guests slow down with every busy host CPU.

Usage: python benchmarks/vm_boot.py [--rounds N] [--no-tests]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import pytest  # noqa: E402

import vmplugin  # noqa: E402


class _Batch:
    """Collects the node ids of the vm tests the outer run would give the default kernel."""

    def __init__(self) -> None:
        self.nodeids: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.nodeids = [item.nodeid for item in session.items
                        if item.get_closest_marker("vm") and vmplugin.kernel_of(item) is None]


def default_batch() -> list[str]:
    batch = _Batch()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        pytest.main(["--collect-only", "-q", "-m", "vm", "-p", "no:cacheprovider", "tests"],
                     plugins=[batch])
    if not batch.nodeids:
        sys.exit("no vm tests collected")
    return batch.nodeids


def first_output(argv: list[str], stop: bool = False) -> tuple[float, float, int]:
    """(seconds to the first byte of stdout, seconds to exit, exit status); ``stop``: end the
    command (SIGTERM, which `zcnet vm run` unwinds, killing the guest) once it has output."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    t_first = time.monotonic() - t0
    if stop:
        proc.terminate()
    proc.stdout.read()
    rc = proc.wait()
    return (t_first if first else float("nan")), time.monotonic() - t0, rc


def zcnet_vm(*cmd: str) -> list[str]:
    return [sys.executable, "-m", "zcnet", "vm", "run", "--", *cmd]


def row(name: str, samples: list[float]) -> float:
    med = statistics.median(samples)
    print(f"{name:<34} median {med:7.2f} s  ({', '.join(f'{s:.2f}' for s in samples)})")
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-tests", action="store_true", help="skip the run of all vm tests")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    os.chdir(ROOT)
    nodeids = default_batch()
    inner = vmplugin.inner_argv(nodeids)
    print(f"first test: the vm plugin's inner pytest run of {len(nodeids)} vm tests, stopped "
          "(SIGTERM) at its first output")
    echo, numpy_vm, numpy_host, first_test = [], [], [], []
    for _ in range(args.rounds):
        echo.append(first_output(zcnet_vm("echo", "up"))[0])
        numpy_vm.append(first_output(zcnet_vm(sys.executable, "-c",
                                              "import numpy; print(1)"))[1])
        numpy_host.append(first_output([sys.executable, "-c", "import numpy; print(1)"])[1])
        first_test.append(first_output(zcnet_vm(*inner), stop=True)[0])
    t_echo = row("vm run -> first output (echo)", echo)
    t_first = row("vm run -> first test output", first_test)
    t_vm = row("vm run python -c 'import numpy'", numpy_vm)
    t_host = row("host python -c 'import numpy'", numpy_host)
    print(f"ratio guest/host for 'import numpy' (incl. boot): {t_vm / t_host:.1f}x")
    print(f"target vm_first_output {t_echo:.2f} s goal 15")
    print(f"target vm_first_test {t_first:.2f} s goal 15")
    if not args.no_tests:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "vm", "tests"],
                              cwd=ROOT, capture_output=True, text=True)
        elapsed = time.monotonic() - t0
        print((proc.stdout.strip().splitlines() or ["(no output)"])[-1])
        print(f"target vm_tests_all {elapsed:.1f} s goal 240")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
