# Sourced by scripts/bench.sh and scripts/test.sh: picks the Python that zcnet is installed into.
#
#   source scripts/env.sh            then "$ZCNET_PY" runs a Python that can install zcnet
#
# PYTHON (default python3) is used directly when pip may install into it. Where it may not -- a
# distribution's Python marked EXTERNALLY-MANAGED (PEP 668, Debian 12, Ubuntu 24.04), or one
# without pip -- a virtual environment is made at ZCNET_VENV (default .venv) from that Python,
# installing python3-venv with apt first if root and it is missing. The venv does not see the
# system's site-packages, so every dependency comes from pyproject.toml. Setting ZCNET_VENV
# always uses a venv.

PYTHON="${PYTHON:-python3}"

zcnet_pip_refused() {
  # PEP 668: a marker file in the stdlib directory of a Python that is not itself a venv.
  "$PYTHON" - <<'PY'
import os, sys, sysconfig
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(0 if managed and sys.prefix == sys.base_prefix else 1)
PY
}

zcnet_need_venv_module() {
  "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    local ver
    ver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    echo "zcnet: installing python3-venv (apt) to make a virtual environment" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null \
      || apt-get install -y -qq --no-install-recommends "python${ver}-venv" >/dev/null
  fi
  "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null && return 0
  echo "zcnet: error: $PYTHON cannot make a virtual environment (no ensurepip/venv)" >&2
  echo "zcnet: fix: apt-get install python3-venv (as root), then run this again" >&2
  return 1
}

if ! command -v "$PYTHON" >/dev/null; then
  echo "zcnet: error: no $PYTHON found" >&2
  echo "zcnet: fix: apt-get install python3 (Python >= 3.10), or set PYTHON=/path/to/python3" >&2
  exit 1
fi

if [ -n "${ZCNET_VENV:-}" ] || zcnet_pip_refused || ! "$PYTHON" -m pip --version >/dev/null 2>&1
then
  ZCNET_VENV="${ZCNET_VENV:-$PWD/.venv}"
  if [ ! -x "$ZCNET_VENV/bin/python" ]; then
    zcnet_need_venv_module || exit 1
    echo "zcnet: $PYTHON may not install packages system-wide; using a venv in $ZCNET_VENV" >&2
    "$PYTHON" -m venv "$ZCNET_VENV"
  fi
  ZCNET_PY="$ZCNET_VENV/bin/python"
  ZCNET_BIN="$ZCNET_VENV/bin/"
else
  ZCNET_PY="$PYTHON"
  ZCNET_BIN=""
fi
export ZCNET_PY ZCNET_BIN
