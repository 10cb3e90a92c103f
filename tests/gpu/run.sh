#!/usr/bin/env bash
# The GPU checks, in one go, on a machine with an NVIDIA GPU and its driver: builds
# replayd, runs the CUDA driver tests and the device suite on cuda:0, the decode demo on
# cuda:0, and the per-kernel benchmark (a replayed 32-call graph against 32 eager
# launches) on cuda:0 and cpu:0, then writes tests/gpu/RESULTS.md with what it saw.
# Each step has its own time limit; a failing or hanging step is recorded and the rest
# still run; the exit status says whether all passed. The device suite runs twice: with
# each tenant's CUDA work in an executor process (the default) and in the daemon's process
# (REPLAYD_TEST_ISOLATION=shared). The kernel-fault cases run each in a process of their
# own, last: a CUDA kernel fault is sticky for every context of the process that saw it. Logs of every step are kept in $REPLAYD_GPU_LOGS when it is set. On a machine that cannot build (no network, no Debian packages), pack the
# binaries where they were built (tests/gpu/pack.sh) and run with REPLAYD_PACK=gpu-pack.
set -uo pipefail
cd "$(dirname "$0")/../.."
build_dir=${BUILD_DIR:-build}
if [ -n "${REPLAYD_PACK:-}" ]; then
  build_dir=$REPLAYD_PACK
  # The daemon finds replayd-executor and replayd-cc beside itself; the tests are told.
  export REPLAYD_PREBUILT=1 LD_LIBRARY_PATH="$REPLAYD_PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    REPLAYD_TEST_BIN_DIR="$REPLAYD_PACK/server"
fi
results=tests/gpu/RESULTS.md
if [ -n "${REPLAYD_GPU_LOGS:-}" ]; then
  logs=$REPLAYD_GPU_LOGS
  mkdir -p "$logs"
else
  logs=$(mktemp -d)
  trap 'rm -rf "$logs"' EXIT
fi
status=0

step() {  # step NAME SECONDS COMMAND...: runs COMMAND for at most SECONDS, keeps its output as $logs/NAME
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most ${limit} s): $*" >&2
  local rc=0
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "ok" >"$logs/$name.rc"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "TIMED OUT after ${limit} s" >"$logs/$name.rc"
    status=1
  else
    echo "FAILED (exit $rc)" >"$logs/$name.rc"
    status=1
  fi
  tail -n 5 "$logs/$name" >&2
}

section() {  # section TITLE NAME [FILTER]: a results section with the step's outcome and output
  echo
  echo "## $1 — $(cat "$logs/$2.rc" 2>/dev/null || echo 'not run')"
  echo
  echo '```'
  if [ -n "${3:-}" ]; then grep -E "$3" "$logs/$2" | tail -n 60; else tail -n 60 "$logs/$2"; fi
  echo '```'
}

fault_case='Devices/DeviceTest.AKernelFaultIsContainedToItsExecutorOrEndsTheDaemonsDeviceService'
if [ -n "${REPLAYD_PACK:-}" ]; then
  step build 10 echo "prebuilt binaries from $REPLAYD_PACK"
else
  step build 1800 env BUILD_DIR="$build_dir" bash deploy/build.sh
fi
step gpu 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step driver 120 "$build_dir/tests/cuda_driver_test"
step suite 300 "$build_dir/tests/integration_test" --gtest_filter="Devices/*:-$fault_case/*"
step suite_shared 300 env REPLAYD_TEST_ISOLATION=shared "$build_dir/tests/integration_test" --gtest_filter="Devices/*:-$fault_case/*"
step demo 240 env BUILD_DIR="$build_dir" REPLAYD_DEMO_DEVICE=cuda:0 REPLAYD_DEMO_PORT=7171 bash deploy/demo.sh
step bench_cuda 180 "$build_dir/tests/bench/replayd_device_bench" --device=cuda:0 --runs=7 --iterations=500
step bench_cpu 180 "$build_dir/tests/bench/replayd_device_bench" --device=cpu:0 --runs=7 --iterations=500
step fault_executor 60 "$build_dir/tests/integration_test" --gtest_filter="$fault_case/cuda_0_cuda_c"
step fault_session 60 env REPLAYD_TEST_ISOLATION=shared "$build_dir/tests/integration_test" --gtest_filter="$fault_case/cuda_0_cuda_c"
step fault_primary 60 env REPLAYD_TEST_ISOLATION=shared "$build_dir/tests/integration_test" --gtest_filter="$fault_case/cuda_0_cuda_c_primary"

{
  echo "# GPU results"
  echo
  echo "Written by \`bash tests/gpu/run.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
  echo "Host: $(nproc) cores; GPU: $(cat "$logs/gpu" 2>/dev/null | head -n 1)."
  section "Build" build 'error|warning|Built target replayd$|prebuilt'
  section "CUDA driver tests (cuda_driver_test)" driver '^\[ *(OK|FAILED|SKIPPED) +\]|^\[ +PASSED +\]|Skipped|Failure'
  section "Device suite, tenants in executors (integration_test --gtest_filter='Devices/*')" suite \
    '^\[ *(OK|FAILED) +\]|^\[ +(PASSED|SKIPPED) +\] [0-9]+ test|Failure'
  section "Device suite in the daemon's process (REPLAYD_TEST_ISOLATION=shared)" suite_shared \
    '^\[ *(OK|FAILED) +\]|^\[ +(PASSED|SKIPPED) +\] [0-9]+ test|Failure'
  section "Decode demo on cuda:0 (deploy/demo.sh)" demo
  section "Per-kernel cost on cuda:0 (replayd_device_bench --device=cuda:0)" bench_cuda
  section "The same on cpu:0, for comparison" bench_cpu
  section "A kernel fault in an executor (one process)" fault_executor '^\[ *(OK|FAILED|SKIPPED) +\]|Failure|Expected|Which is|Actual'
  section "A kernel fault in the daemon's process, session contexts (one process)" fault_session '^\[ *(OK|FAILED|SKIPPED) +\]|Failure|Expected|Which is|Actual'
  section "A kernel fault in the daemon's process, the primary context (one process)" fault_primary '^\[ *(OK|FAILED|SKIPPED) +\]|Failure|Expected|Which is|Actual' 
} >"$results"
echo "wrote $results" >&2
exit "$status"
