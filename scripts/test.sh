#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs it.
# Usage: bash scripts/test.sh [pytest args...]
# A Python that refuses pip (PEP 668) gets a venv, as in scripts/bench.sh (see scripts/env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

apt_pkgs=(bpftool iperf3 sockperf iproute2 ethtool kmod util-linux procps python3-venv
          qemu-system-x86 busybox-static zstd
          build-essential flex bison bc libelf-dev patch xz-utils
          python3-dev  # headers for the compiled hot path (zcnet.uring._accel)
          cpio)        # the vm runner's initramfs
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "note: not root, cannot apt-get install ${missing[*]}; tests needing them will skip" >&2
  fi
fi

source scripts/env.sh
"$ZCNET_PY" -m pip install -q --disable-pip-version-check -e '.[test]'
# The install builds the compiled hot paths when a compiler exists; the tests then run both
# paths (tests/uring_backends.py, the loop_pass fixture). A compiler with no accelerator means
# the build failed.
if command -v cc >/dev/null; then
  for mod in zcnet.uring._accel zcnet.rx.zc._rxaccel zcnet.aio._loopaccel; do
    if ! "$ZCNET_PY" -c "import $mod" 2>/dev/null; then
      echo "error: a C compiler exists but $mod did not build: run pip install -v -e . to see why" >&2
      exit 1
    fi
  done
fi
"$ZCNET_PY" -m ruff check src tests benchmarks examples
# The layer contracts in pyproject.toml ([tool.importlinter]); lint-imports has no -m entry.
"$ZCNET_PY" -c 'import sys; from importlinter.cli import lint_imports_command as li; sys.exit(li())'
exec "$ZCNET_PY" -m pytest -q "$@"
