#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs it.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

apt_pkgs=(bpftool iperf3 sockperf iproute2 ethtool kmod util-linux procps
          qemu-system-x86 busybox-static
          build-essential flex bison bc libelf-dev patch xz-utils)
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

python3 -m pip install -q --disable-pip-version-check -e '.[test]'
python3 -m ruff check src tests benchmarks examples
exec python3 -m pytest -q "$@"
