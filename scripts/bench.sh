#!/usr/bin/env bash
# Installs zcnet (into a venv where the system's Python refuses pip, see env.sh) and runs
# `zcnet bench` with the given arguments.
# Usage: bash scripts/bench.sh [zcnet bench options...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

"$ZCNET_PY" -m pip install -q --disable-pip-version-check .
if [ -n "$ZCNET_BIN" ]; then
  echo "zcnet: installed in $ZCNET_BIN (run it as ${ZCNET_BIN}zcnet, or after" \
       "'. ${ZCNET_BIN}activate' as zcnet)" >&2
fi
exec "$ZCNET_PY" -m zcnet bench "$@"
