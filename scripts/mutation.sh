#!/usr/bin/env bash
# Mutation testing (mutmut) of the data paths, each module against the tests of its own package.
# Slow (minutes to hours per module) and not part of CI.
#
# Usage: bash scripts/mutation.sh [MODULE...]      e.g. rx/zc/devmem.py tx/sendzc.py
#   no argument: every module below. Env: MUTATION_DIR (work copies, default /tmp/zcnet-mutation),
#   MUTATION_JOBS (parallel test processes, default: CPU count).
# Each module is mutated in its own copy of the tree (src, tests, pyproject.toml), so the
# checkout is never touched; the score and the surviving mutants are printed per module, and
# the full results stay in MUTATION_DIR/<module>/ (`python -m mutmut show NAME` there).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=${MUTATION_DIR:-/tmp/zcnet-mutation}
jobs=${MUTATION_JOBS:-$(nproc)}

# module (under src/zcnet) -> the tests of its package. Tests that start Python subprocesses
# importing zcnet are left out: under mutmut those import the instrumented copy without the
# runner's state and fail before any mutant runs.
declare -A TESTS=(
  [rx/zc/api.py]="tests/test_zc_soft.py tests/test_zc_devmem.py tests/test_zc_review.py"
  [rx/zc/soft.py]="tests/test_zc_soft.py tests/test_zc_review.py tests/test_zc_engines.py"
  [rx/zc/devmem.py]="tests/test_zc_devmem.py"
  [rx/zc/zcrx.py]="tests/test_zc_zcrx.py"
  [tx/senders.py]="tests/test_tx_senders.py tests/test_tx_review.py"
  [tx/sendzc.py]="tests/test_tx_senders.py tests/test_tx_review.py"
  [tx/zerocopy.py]="tests/test_tx_zerocopy.py tests/test_tx_senders.py"
  [uring/bufring.py]="tests/test_uring_ring.py"
  [nic/setup.py]="tests/test_nic_setup.py tests/test_nic_codec.py"
)
ORDER=(rx/zc/api.py rx/zc/soft.py rx/zc/devmem.py rx/zc/zcrx.py tx/senders.py tx/sendzc.py
       tx/zerocopy.py uring/bufring.py nic/setup.py)

modules=("$@")
((${#modules[@]})) || modules=("${ORDER[@]}")

toml_list() {  # words -> a TOML array of strings
  local out="" w
  for w in "$@"; do out+="\"$w\", "; done
  echo "[${out%, }]"
}

for mod in "${modules[@]}"; do
  [[ -n ${TESTS[$mod]:-} ]] || { echo "unknown module $mod (choose from ${ORDER[*]})" >&2; exit 2; }
  dir=$work/${mod//\//_}
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -r "$root/src" "$root/tests" "$root/pyproject.toml" "$dir/"
  # shellcheck disable=SC2086  # the test pattern is a glob on purpose
  tests=$(cd "$dir" && ls ${TESTS[$mod]})
  # shellcheck disable=SC2086
  cat >> "$dir/pyproject.toml" <<TOML

[tool.mutmut]
source_paths = ["src"]
only_mutate = ["src/zcnet/$mod"]
pytest_add_cli_args_test_selection = $(toml_list $tests)
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]
TOML
  echo "== $mod against: $(echo $tests)"
  marker=$dir/.started
  touch "$marker"
  (cd "$dir" && python -m mutmut run --max-children "$jobs" >"$dir/run.log" 2>&1) || true
  # A mutant that hangs is killed with its test's fixtures still up: remove the test
  # namespaces (zctx<pid>, tests/test_tx_senders.py) that such killed workers left.
  for ns in /run/netns/zctx*; do
    [[ -e $ns && $ns -nt $marker ]] || continue
    pid=${ns##*/zctx}
    [[ -d /proc/$pid ]] || ip netns del "${ns##*/}" || true
  done
  (cd "$dir" && python -m mutmut results --all true >"$dir/results.txt" 2>&1) || true
  python3 - "$dir/results.txt" "$mod" <<'PY'
import collections
import re
import sys

rows = [line.strip() for line in open(sys.argv[1]) if ":" in line]
status = collections.Counter(r.rsplit(":", 1)[1].strip() for r in rows)
killed = status.get("killed", 0) + status.get("timeout", 0)
counted = sum(n for s, n in status.items() if s not in ("skipped", "not checked"))
score = 100.0 * killed / counted if counted else 0.0
print(f"score {sys.argv[2]} {score:.1f} % ({killed} killed of {counted}; {dict(status)})")
for r in rows:
    if r.rsplit(":", 1)[1].strip() in ("survived", "no tests"):
        print("  survived:", r.rsplit(":", 1)[0])
PY
done
