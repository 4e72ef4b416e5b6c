#!/usr/bin/env bash
# Mutation testing of the data paths, each module against the tests of its own package: the
# Python modules with mutmut, the C accelerators (*.c) with scripts/cmutation.py (one textual
# mutation at a time, the extension rebuilt in place, the tests run on the compiled path).
# Slow (minutes to hours per module) and not part of CI.
#
# Usage: bash scripts/mutation.sh [MODULE...]      e.g. rx/zc/devmem.py rx/zc/_c/chunks.c
#   no argument: every module below. Env: MUTATION_DIR (work copies, default /tmp/zcnet-mutation),
#   MUTATION_JOBS (parallel test processes, default: CPU count), MUTATION_ONLY (mutant names:
#   run only these, e.g. a previous run's survivors after new tests; the score then covers them),
#   MUTATION_SAMPLE / MUTATION_SEED (C only: that many mutants at random, e.g. 40; default all).
# Exits non-zero when a module yields no score (mutmut or the build failed, no mutant ran), after
# trying the others.
# Each module is mutated in its own copy of the tree (src, tests, pyproject.toml), so the
# checkout is never touched. The copy gets its own compiled accelerators (setup.py): without
# them the tests run only the pure-Python paths, and the code feeding the C paths (the
# receiver's chunk constructor) looks untested. The score and the surviving mutants are printed
# per module; the full results stay in MUTATION_DIR/<module>/ (`python -m mutmut show NAME`
# there).
# The score excludes the survivors listed in scripts/mutation-equivalent.txt, each with the
# reason it cannot be killed (equivalent, or not observable single-threaded).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=${MUTATION_DIR:-/tmp/zcnet-mutation}
jobs=${MUTATION_JOBS:-$(nproc)}

# module (under src/zcnet) -> the tests of its package. Tests that start Python subprocesses
# importing zcnet are left out: under mutmut those import the instrumented copy without the
# runner's state and fail before any mutant runs.
declare -A TESTS=(
  [rx/zc/chunks.py]="tests/rx/test_zc_api.py tests/rx/test_zc_soft.py tests/rx/test_zc_devmem.py"
  [rx/zc/receiver.py]="tests/rx/test_zc_api.py tests/rx/test_zc_soft.py tests/rx/test_zc_fastpath.py tests/rx/test_zc_devmem.py tests/rx/test_zc_zcrx.py"
  [rx/zc/debugviews.py]="tests/rx/test_zc_api.py tests/rx/test_zc_soft.py"
  [rx/zc/opener.py]="tests/rx/test_zc_api.py tests/rx/test_zc_soft.py tests/rx/test_zc_devmem.py tests/rx/test_zc_zcrx.py"
  [rx/zc/soft.py]="tests/rx/test_zc_soft.py tests/rx/test_zc_fastpath.py tests/rx/test_zc_engines.py tests/aio/test_aio_shared.py"
  [rx/zc/devmem.py]="tests/rx/test_zc_devmem.py"
  [rx/zc/zcrx.py]="tests/rx/test_zc_zcrx.py"
  [rx/zc/zcrx_reg.py]="tests/rx/test_zc_zcrx.py"
  [rx/zc/zcrx_rings.py]="tests/rx/test_zc_zcrx.py"
  [rx/zc/netqueue.py]="tests/rx/test_zc_zcrx.py tests/rx/test_zc_devmem.py"
  [rx/zc/soft_inc.py]="tests/rx/test_zc_soft.py"
  [rx/zc/area.py]="tests/rx/test_zc_area.py"
  [rx/zc/bookkeeping.py]="tests/rx/test_zc_api.py tests/rx/test_zc_soft.py"
  [rx/zc/provider.py]="tests/rx/test_zc_zcrx.py tests/rx/test_zc_soft.py tests/rx/test_zc_fastpath.py tests/rx/test_zc_devmem.py"
  [rx/zc/engines.py]="tests/rx/test_zc_engines.py"
  [tx/senders.py]="tests/tx/test_tx_senders.py"
  [tx/sendzc.py]="tests/tx/test_tx_senders.py"
  [tx/zerocopy.py]="tests/tx/test_tx_zerocopy.py tests/tx/test_tx_senders.py"
  [uring/bufring.py]="tests/uring/test_uring_ring.py"
  [nic/setup.py]="tests/nic/test_nic_setup.py tests/nic/test_nic_codec.py"
  [aio/receiver.py]="tests/aio/test_aio_receiver.py tests/aio/test_aio_fastpaths.py tests/aio/test_aio_shared.py"
  [aio/shared.py]="tests/aio/test_aio_shared.py tests/aio/test_aio_receiver.py tests/aio/test_aio_loopaccel.py"
  [aio/pool.py]="tests/aio/test_aio_pool.py"
  [aio/protocol.py]="tests/aio/test_aio_protocol.py tests/aio/test_aio_loopaccel.py"
  [aio/sender.py]="tests/aio/test_aio_sender.py tests/aio/test_aio_fastpaths.py"
  [aio/wakeup.py]="tests/aio/test_aio_receiver.py tests/aio/test_aio_sender.py"
  [aio/sockets.py]="tests/aio/test_aio_faults.py tests/aio/test_aio_adopt.py"
  [aio/backend.py]="tests/aio/test_aio_trio.py tests/aio/test_aio_anyio.py"
  # The C accelerators (scripts/cmutation.py). Their tests may start interpreters: the work copy
  # is a plain tree, not an instrumented one.
  [uring/_accel.c]="tests/uring/test_uring_ring.py tests/uring/test_ring_hostile.py tests/uring/test_accel_bounds.py tests/uring/test_accel_cqe.py"
  [rx/zc/_c/chunks.c]="tests/rx/test_zc_api.py tests/rx/test_zc_soft.py tests/rx/test_zc_fastpath.py tests/uring/test_accel_bounds.py tests/rx/test_zc_zcrx.py"
  # zcnet.aio._loopaccel, a file per object (module.c only interns names and adds the types)
  [aio/_c/router.c]="tests/aio/test_aio_loopaccel.py tests/aio/test_aio_loopaccel_gc.py tests/aio/test_aio_shared.py tests/aio/test_aio_reentry.py tests/aio/test_aio_protocol.py"
  [aio/_c/round.c]="tests/aio/test_aio_loopaccel.py tests/aio/test_aio_loopaccel_gc.py tests/aio/test_aio_fastpaths.py tests/aio/test_aio_reentry.py tests/aio/test_aio_protocol.py"
  [aio/_c/anext.c]="tests/aio/test_aio_fastpaths.py tests/aio/test_aio_loopaccel_gc.py tests/aio/test_aio_loopaccel.py tests/aio/test_aio_receiver.py"
  [aio/_c/copysend.c]="tests/aio/test_aio_fastpaths.py tests/aio/test_aio_sender.py tests/aio/test_aio_loopaccel_gc.py"
)
# The issue's targets first (rx/zc/api.py only re-exports: its code is chunks, receiver,
# debugviews and opener; zcrx's is zcrx, zcrx_reg, zcrx_rings and netqueue), then the rest of
# rx/zc, tx, the ring and the NIC setup.
ORDER=(rx/zc/chunks.py rx/zc/receiver.py rx/zc/debugviews.py rx/zc/opener.py rx/zc/soft.py
       rx/zc/devmem.py rx/zc/zcrx.py rx/zc/zcrx_reg.py rx/zc/zcrx_rings.py rx/zc/netqueue.py
       tx/sendzc.py rx/zc/soft_inc.py rx/zc/area.py rx/zc/bookkeeping.py rx/zc/provider.py
       rx/zc/engines.py tx/senders.py tx/zerocopy.py uring/bufring.py nic/setup.py
       aio/receiver.py aio/shared.py aio/pool.py aio/protocol.py aio/sender.py aio/wakeup.py
       aio/sockets.py aio/backend.py rx/zc/_c/chunks.c uring/_accel.c aio/_c/router.c
       aio/_c/round.c aio/_c/anext.c aio/_c/copysend.c)

modules=("$@")
((${#modules[@]})) || modules=("${ORDER[@]}")
for mod in "${modules[@]}"; do
  [[ -n ${TESTS[$mod]:-} ]] || { echo "unknown module $mod (choose from ${ORDER[*]})" >&2; exit 2; }
  if [[ $mod != *.c ]]; then
    python -c "import mutmut" 2>/dev/null || {
      echo "mutmut is not installed: pip install 'mutmut>=3.8,<4'" >&2; exit 2; }
  fi
done
failed=()

toml_list() {  # words -> a TOML array of strings
  local out="" w
  for w in "$@"; do out+="\"$w\", "; done
  echo "[${out%, }]"
}

for mod in "${modules[@]}"; do
  dir=$work/${mod//\//_}
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -r "$root/src" "$root/tests" "$root/pyproject.toml" "$root/setup.py" "$dir/"
  (cd "$dir" && python setup.py -q build_ext --inplace --force >"$dir/build.log" 2>&1) || true
  compgen -G "$dir/src/zcnet/uring/_accel*.so" >/dev/null ||
    echo "   (the accelerator did not build, see $dir/build.log: pure-Python paths only)"
  # A listed test file may have been folded into another one: use those that exist.
  tests=""
  for t in ${TESTS[$mod]}; do
    if [[ -e $dir/$t ]]; then tests+="$t "; else echo "   ($t does not exist: left out)"; fi
  done
  [[ -n $tests ]] || { echo "no test file of $mod exists" >&2; failed+=("$mod"); continue; }
  if [[ $mod == *.c ]]; then
    # shellcheck disable=SC2086
    python "$root/scripts/cmutation.py" --work "$dir" --file "src/zcnet/$mod" --tests "$tests" \
      --sample "${MUTATION_SAMPLE:-0}" --seed "${MUTATION_SEED:-1}" \
      --equivalent "$root/scripts/mutation-equivalent.txt" ${MUTATION_ONLY:+--only $MUTATION_ONLY} \
      | tee "$dir/results.txt" || failed+=("$mod")
    continue
  fi
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
  # shellcheck disable=SC2086
  (cd "$dir" && python -m mutmut run --max-children "$jobs" ${MUTATION_ONLY:-} \
     >"$dir/run.log" 2>&1) || true
  # A mutant that hangs is killed with its test's fixtures still up: remove the test
  # namespaces (zctx<pid>, tests/tx/test_tx_senders.py) that such killed workers left.
  for ns in /run/netns/zctx*; do
    [[ -e $ns && $ns -nt $marker ]] || continue
    pid=${ns##*/zctx}
    [[ -d /proc/$pid ]] || ip netns del "${ns##*/}" || true
  done
  (cd "$dir" && python -m mutmut results --all true >"$dir/results.txt" 2>&1) || true
  if python3 - "$dir/results.txt" "$mod" "$root/scripts/mutation-equivalent.txt" <<'PY'
import collections
import sys

results, mod, equivalent_file = sys.argv[1:4]
rows = [line.strip().rsplit(":", 1) for line in open(results) if ":" in line]
# Only mutmut's own verdicts: an error message in the file is no result.
verdicts = {"killed", "survived", "timeout", "segfault", "suspicious", "skipped", "not checked",
            "no tests", "check was interrupted by user"}
rows = [(name.strip(), st.strip()) for name, st in rows if st.strip() in verdicts]
# Mutants judged equivalent (same behaviour) or not observable single-threaded, one per line:
# "NAME  reason". Their names number the mutants of one function, so an edit there can shift
# them: the list is checked against each run (a listed mutant that was killed is reported).
equivalent = {}
for line in open(equivalent_file):
    if line.strip() and not line.startswith("#"):
        name, _, why = line.strip().partition(" ")
        equivalent[name] = why.strip()
status = collections.Counter(st for _, st in rows)
# A mutant whose tests crashed (segfault) or hung (timeout) was detected as surely as one
# that failed an assertion.
killed = sum(status.get(st, 0) for st in ("killed", "timeout", "segfault"))
counted = sum(n for st, n in status.items() if st not in ("skipped", "not checked"))
excused = [n for n, st in rows if st in ("survived", "no tests") and n in equivalent]
if counted <= len(excused):  # mutmut failed, or mutated nothing that ran: no score
    print(f"score {mod}: none ({dict(status) or 'no results'}; see {results} and run.log)")
    sys.exit(1)
raw = 100.0 * killed / counted
net = 100.0 * killed / (counted - len(excused))
print(f"score {mod} {net:.1f} % without {len(excused)} equivalent ({killed} killed of "
      f"{counted - len(excused)}; raw {raw:.1f} %; {dict(status)})")
for name, st in rows:
    if st in ("survived", "no tests") and name not in equivalent:
        print("  survived:", name)
    elif st == "suspicious":  # the tests died by a signal other than SEGV/KILL: look at it
        print("  suspicious (not counted as killed):", name)
    elif name in equivalent and st not in ("survived", "no tests"):
        print(f"  listed as equivalent but {st}: {name}")
PY
  then :; else failed+=("$mod"); fi
done
if ((${#failed[@]})); then
  echo "no score for: ${failed[*]}" >&2
  exit 1
fi
