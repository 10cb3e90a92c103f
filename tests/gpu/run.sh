#!/usr/bin/env bash
# The GPU checks, in one go, on a machine with an NVIDIA GPU and its driver: builds
# replayd, runs the CUDA driver tests and the device suite on cuda:0, the decode demo on
# cuda:0 (sampling the GPU's per-process memory meanwhile: the footprint of an executor's
# CUDA context), and the per-kernel benchmark (a replayed 32-call graph against 32 eager
# launches) on cuda:0 and cpu:0, then writes tests/gpu/RESULTS.md with what it saw.
#
# Each step has its own time limit; a failing or hanging step is recorded and the rest
# still run; the exit status says whether all passed. A gtest step that matches no test
# fails. The device suite runs twice: with each tenant's CUDA work in an executor process
# (the default) and in the daemon's process (REPLAYD_TEST_ISOLATION=shared). The
# kernel-fault cases run each in a process of their own, last: a CUDA kernel fault is
# sticky for every context of the process that saw it.
#
# Environment:
#   REPLAYD_PACK         binaries packed where they were built (tests/gpu/pack.sh), for a
#                        machine that cannot build (no network, no Debian packages)
#   REPLAYD_GPU_LOGS     keep every step's full log there
#   REPLAYD_GPU_SECONDS  the whole run's time: each step gets at most what is left (less
#                        some for the results), and a step with too little left is recorded
#                        as not run, so that the results are written within a machine's
#                        time per command
#   REPLAYD_GPU_STEPS    run only these steps (names as below, space-separated)
#   REPLAYD_GPU_RESULTS  where the results go (tests/gpu/RESULTS.md)
set -uo pipefail
cd "$(dirname "$0")/../.."
started_at=$(date +%s)
build_dir=${BUILD_DIR:-build}
if [ -n "${REPLAYD_PACK:-}" ]; then
  # Absolute: the daemon's children (the compiler cage) start in directories of their own.
  REPLAYD_PACK=$(cd "$REPLAYD_PACK" && pwd)
  build_dir=$REPLAYD_PACK
  # The daemon finds replayd-executor and replayd-cc beside itself; the tests are told.
  export REPLAYD_PREBUILT=1 LD_LIBRARY_PATH="$REPLAYD_PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    REPLAYD_TEST_BIN_DIR="$REPLAYD_PACK/server"
fi
results=${REPLAYD_GPU_RESULTS:-tests/gpu/RESULTS.md}
if [ -n "${REPLAYD_GPU_LOGS:-}" ]; then
  logs=$REPLAYD_GPU_LOGS
  mkdir -p "$logs"
else
  logs=$(mktemp -d)
  trap 'rm -rf "$logs"' EXIT
fi
status=0
reserve=15  # seconds kept for writing the results

wanted() {  # wanted NAME: whether REPLAYD_GPU_STEPS (if set) names the step
  [ -z "${REPLAYD_GPU_STEPS:-}" ] || [[ " $REPLAYD_GPU_STEPS " == *" $1 "* ]]
}

step() {  # step NAME SECONDS COMMAND...: runs COMMAND for at most SECONDS, keeps its output as $logs/NAME
  local name=$1 limit=$2
  shift 2
  wanted "$name" || return 0
  if [ -n "${REPLAYD_GPU_SECONDS:-}" ]; then
    local left=$((REPLAYD_GPU_SECONDS - ($(date +%s) - started_at) - reserve))
    if [ "$left" -lt 10 ]; then
      echo "== $name: not run, the run's time (REPLAYD_GPU_SECONDS=$REPLAYD_GPU_SECONDS) is spent" >&2
      echo "NOT RUN: out of time" >"$logs/$name.rc"
      : >"$logs/$name"
      status=1
      return 0
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "== $name (at most ${limit} s): $*" >&2
  local rc=0 t0
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name" 2>&1 || rc=$?
  local took=$(($(date +%s) - t0))
  if [ "$rc" -eq 0 ] && grep -qE '^\[==========\] 0 tests? from' "$logs/$name"; then
    echo "FAILED: no test matched (${took} s)" >"$logs/$name.rc"
    status=1
  elif [ "$rc" -eq 0 ]; then
    echo "ok (${took} s)" >"$logs/$name.rc"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "TIMED OUT after ${limit} s" >"$logs/$name.rc"
    status=1
  else
    echo "FAILED (exit $rc, ${took} s)" >"$logs/$name.rc"
    status=1
  fi
  tail -n 5 "$logs/$name" >&2
}

section() {  # section TITLE NAME [FILTER]: a results section with the step's outcome and output
  echo
  echo "## $1 — $(cat "$logs/$2.rc" 2>/dev/null || echo 'not run')"
  echo
  echo '```'
  if [ -n "${3:-}" ]; then grep -E "$3" "$logs/$2" 2>/dev/null | tail -n 60; else tail -n 60 "$logs/$2" 2>/dev/null; fi
  echo '```'
}

# The demo, with the GPU's compute processes sampled every 200 ms meanwhile (their
# largest memory each, in $logs/footprint), and the daemon's log kept (in $logs/demo_daemon).
demo_with_footprint() {
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits -lms 200 \
    >"$logs/apps" 2>&1 &
  local sampler=$!
  local rc=0
  env BUILD_DIR="$build_dir" REPLAYD_DEMO_DEVICE=cuda:0 REPLAYD_DEMO_PORT=7171 \
    REPLAYD_DEMO_LOG="$logs/demo_daemon" bash deploy/demo.sh || rc=$?
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
  awk -F', *' 'NF >= 3 && $3 ~ /^[0-9]+$/ { n = $2; sub(/.*\//, "", n); k = $1 " " n; if ($3 > m[k]) m[k] = $3 }
               END { for (k in m) print k ": at most " m[k] " MiB" }' "$logs/apps" | sort >"$logs/footprint"
  echo "sampled during the demo" >"$logs/footprint.rc"
  echo "kept from the demo" >"$logs/demo_daemon.rc"
  return "$rc"
}
export -f demo_with_footprint
export logs build_dir

fault_case='Devices/DeviceTest.AKernelFaultIsContainedToItsExecutorOrEndsTheDaemonsDeviceService'
if [ -n "${REPLAYD_PACK:-}" ]; then
  step build 10 echo "prebuilt binaries from $REPLAYD_PACK"
else
  step build 1800 env BUILD_DIR="$build_dir" bash deploy/build.sh
fi
step gpu 30 sh -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader &&
  echo "locked-memory limit (ulimit -l): $(ulimit -l)"'
step driver 120 "$build_dir/tests/cuda_driver_test"
step demo 240 bash -c demo_with_footprint
step bench_cuda 180 "$build_dir/tests/bench/replayd_device_bench" --device=cuda:0 --runs=7 --iterations=500
step suite 300 "$build_dir/tests/integration_test" --gtest_filter="Devices/*:-$fault_case/*"
step suite_shared 300 env REPLAYD_TEST_ISOLATION=shared "$build_dir/tests/integration_test" --gtest_filter="Devices/*:-$fault_case/*"
step bench_cpu 180 "$build_dir/tests/bench/replayd_device_bench" --device=cpu:0 --runs=7 --iterations=500
step fault_executor 60 "$build_dir/tests/integration_test" --gtest_filter="$fault_case/cuda_0_cuda_c"
step fault_session 60 env REPLAYD_TEST_ISOLATION=shared "$build_dir/tests/integration_test" --gtest_filter="$fault_case/cuda_0_cuda_c"
step fault_primary 60 env REPLAYD_TEST_ISOLATION=shared "$build_dir/tests/integration_test" --gtest_filter="$fault_case/cuda_0_cuda_c_primary"

gtest='^\[ *(OK|FAILED|SKIPPED) +\]|^\[ +(PASSED|SKIPPED) +\] [0-9]+ test|Failure|Expected|Which is|Actual'
{
  echo "# GPU results"
  echo
  echo "Written by \`bash tests/gpu/run.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), in $(($(date +%s) - started_at)) s."
  echo "Host: $(nproc) cores; GPU: $(head -n 1 "$logs/gpu" 2>/dev/null)."
  section "Build" build 'error|warning|Built target replayd$|prebuilt'
  section "GPU" gpu
  section "CUDA driver tests (cuda_driver_test)" driver '^\[ *(OK|FAILED|SKIPPED) +\]|^\[ +PASSED +\]|Skipped|Failure'
  section "Decode demo on cuda:0 (deploy/demo.sh)" demo
  section "GPU memory of each process during the demo (nvidia-smi, sampled every 200 ms)" footprint
  section "The demo daemon's warnings and errors" demo_daemon 'warn|error|staged'
  section "Per-kernel cost on cuda:0 (replayd_device_bench --device=cuda:0)" bench_cuda
  section "Device suite, tenants in executors (integration_test --gtest_filter='Devices/*')" suite "$gtest"
  section "Device suite in the daemon's process (REPLAYD_TEST_ISOLATION=shared)" suite_shared "$gtest"
  section "The same per-kernel cost on cpu:0, for comparison" bench_cpu
  section "A kernel fault in an executor (one process)" fault_executor "$gtest"
  section "A kernel fault in the daemon's process, session contexts (one process)" fault_session "$gtest"
  section "A kernel fault in the daemon's process, the primary context (one process)" fault_primary "$gtest"
} >"$results"
echo "wrote $results" >&2
exit "$status"
