"""C programs the benchmarks compile at run time, with the system compiler, as their baselines
(ring_nop's NOP loop, zc_replay's completion walk, bench_vs_iperf3's c-pair)."""

from __future__ import annotations

import os
import shutil
import subprocess


def compile_c(source: str, workdir: str, name: str, what: str) -> tuple[str | None, str]:
    """``source`` built with ``-O2`` into ``workdir``/``name``: (the executable, a note naming
    the compiler), or (None, why ``what`` is skipped) when there is no compiler or it fails."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None, f"no C compiler (cc/gcc/clang) found: {what} skipped"
    src, exe = os.path.join(workdir, name + ".c"), os.path.join(workdir, name)
    with open(src, "w") as f:
        f.write(source)
    r = subprocess.run([cc, "-O2", "-o", exe, src], capture_output=True, text=True)
    if r.returncode:
        return None, f"{what} failed to compile, skipped: {r.stderr.strip()[:200]}"
    return exe, f"{what}: {os.path.basename(cc)} -O2"
