#!/usr/bin/env bash
# A rehearsal of the GPU checks on a machine without a GPU: packs the build as for a GPU
# machine (tests/gpu/pack.sh), then runs tests/gpu/run.sh from the pack against the fake
# libcuda.so.1 and a fake nvidia-smi. The fake runs no kernels, so the CUDA cases fail;
# what is checked is all that does not need a GPU, which a lent machine's few minutes
# must not be spent finding: every step runs within the budget, every gtest filter
# matches the tests it names (the fault cases one each), the cpu:0 cases of the device
# suite pass from the pack (the executors and the compiler cage find their programs and
# libraries), the demo's kernels load and replay up to its check of the logits, the
# footprint is sampled, and the results have every section; and that
# REPLAYD_GPU_STEPS and REPLAYD_GPU_SECONDS do what they say.
#   rehearse_test.sh BUILD_DIR FAKE_CUDA_DIR       (exit 77: skipped, no patchelf)
set -uo pipefail
build_dir=$(cd "$1" && pwd) fake_cuda=$(cd "$2" && pwd)
cd "$(dirname "$0")/../.."
if ! command -v patchelf >/dev/null; then
  echo "SKIP: patchelf is not installed (deploy/install-deps.sh installs it)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/bin"
cat >"$dir/bin/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in
  *query-compute-apps*) while :; do echo "4242, /pack/server/replayd-executor, 523"; echo "4243, /pack/server/replayd, 3"; sleep 0.2; done ;;
  *) echo "Fake GPU, 580.00, 143771 MiB" ;;
esac
EOF
chmod +x "$dir/bin/nvidia-smi"

BUILD_DIR=$build_dir bash tests/gpu/pack.sh "$dir/pack" >/dev/null || { echo "FAIL: pack.sh"; exit 1; }
fake_run() {  # fake_run LOGS RESULTS [VAR=VALUE...]: run.sh from the pack against the fakes
  local logs=$1 results=$2
  shift 2
  env PATH="$dir/bin:$PATH" LD_LIBRARY_PATH="$fake_cuda" REPLAYD_PACK="$dir/pack" REPLAYD_GPU_LOGS="$logs" \
    REPLAYD_GPU_RESULTS="$results" "$@" bash tests/gpu/run.sh 2>>"$dir/run.err"
}
logs=$dir/logs results=$dir/RESULTS.md
# The pack named relatively, as on a lent machine (REPLAYD_PACK=gpu-pack).
fake_run "$logs" "$results" REPLAYD_PACK="$(realpath --relative-to=. "$dir/pack")" REPLAYD_GPU_SECONDS=400
echo "run.sh exited $? (the fake runs no kernels: failures of CUDA cases are expected)"

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
steps=(build gpu driver demo bench_cuda suite suite_shared bench_cpu fault_executor fault_session fault_primary)
for s in "${steps[@]}"; do
  rc=$(cat "$logs/$s.rc" 2>/dev/null || echo missing)
  echo "$s: $rc"
  case $rc in
    missing | "NOT RUN"* | *"no test matched"* | "TIMED OUT"*) fail "step $s: $rc" ;;
  esac
done
for s in build gpu driver bench_cuda bench_cpu; do
  grep -q '^ok' "$logs/$s.rc" 2>/dev/null || fail "step $s should pass even on the fake: $(cat "$logs/$s.rc" 2>/dev/null)"
done
for s in suite suite_shared; do
  cpu_ok=$(grep -cE '^\[ +OK \] Devices/.*/cpu_0' "$logs/$s")
  cpu_failed=$(grep -E '^\[  FAILED  \] Devices/.*/cpu_0' "$logs/$s")
  cuda_ran=$(grep -cE '^\[ +(OK|FAILED|SKIPPED) +\] Devices/.*/cuda_0' "$logs/$s")
  echo "$s: $cpu_ok cpu:0 cases passed, $cuda_ran cuda:0 cases ran"
  [ "$cpu_ok" -ge 10 ] || fail "$s: only $cpu_ok cpu:0 cases passed"
  [ -z "$cpu_failed" ] || fail "$s: cpu:0 cases failed from the pack:"$'\n'"$cpu_failed"
  [ "$cuda_ran" -ge 10 ] || fail "$s: only $cuda_ran cuda:0 cases ran"
done
for s in fault_executor fault_session fault_primary; do
  grep -qE '^\[==========\] 1 test from' "$logs/$s" || fail "$s: its filter does not name exactly one test"
done
grep -q 'replayd-executor: at most 523 MiB' "$logs/footprint" || fail "the demo's footprint was not sampled"
# The fake runs no kernels, so the logits are wrong; but every kernel of the demo loads
# (its signature is the kernel's own, as the fake reads it from the cubin), captures and
# replays, up to the check of the logits.
grep -q 'logits against the host reference' "$logs/demo" ||
  fail "the demo did not reach its logits on the fake:"$'\n'"$(tail -3 "$logs/demo")"
grep -q '^Host: .*GPU: Fake GPU' "$results" || fail "the results do not name the GPU"
sections=$(grep -c '^## ' "$results")
[ "$sections" -eq 13 ] || fail "the results have $sections sections, not 13"
# REPLAYD_GPU_STEPS runs only the steps it names; a budget too small for any step runs
# none, says so, and still writes the results.
fake_run "$dir/only" "$dir/only.md" REPLAYD_GPU_STEPS="gpu bench_cpu" ||
  fail "REPLAYD_GPU_STEPS='gpu bench_cpu': run.sh failed"
ran=$(cd "$dir/only" && ls -- *.rc 2>/dev/null | tr '\n' ' ')
[ "$ran" = "bench_cpu.rc gpu.rc " ] || fail "REPLAYD_GPU_STEPS='gpu bench_cpu' ran: $ran"
grep -q '^## Device suite.* — not run$' "$dir/only.md" || fail "a step not chosen is not shown as not run"
if fake_run "$dir/spent" "$dir/spent.md" REPLAYD_GPU_SECONDS=20; then fail "run.sh passed with no step run"; fi
grep -q 'NOT RUN: out of time' "$dir/spent/gpu.rc" 2>/dev/null || fail "with 20 s the gpu step ran"
[ ! -s "$dir/spent/suite" ] || fail "with 20 s the suite ran"
grep -q '^## Device suite.* — NOT RUN: out of time$' "$dir/spent.md" || fail "the results do not say the suite was not run"

if [ "$failures" -ne 0 ]; then
  echo "--- run.sh's own output"
  cat "$dir/run.err"
  exit 1
fi
echo "PASS: run.sh ran every step from the pack within its budget"
