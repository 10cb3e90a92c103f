#!/usr/bin/env bash
# The GPU checks, in one go, on a machine with an NVIDIA GPU and its driver: builds
# replayd, runs the CUDA driver tests and the device suite on cuda:0, the decode demo on
# cuda:0, and the per-kernel benchmark (a replayed 32-call graph against 32 eager
# launches) on cuda:0 and cpu:0, then writes tests/gpu/RESULTS.md with what it saw.
# A failing step is recorded and the rest still run; the exit status says whether all
# passed. On a machine that cannot build (no network, no Debian packages), pack the
# binaries where they were built (tests/gpu/pack.sh) and run with REPLAYD_PACK=gpu-pack.
set -uo pipefail
cd "$(dirname "$0")/../.."
build_dir=${BUILD_DIR:-build}
if [ -n "${REPLAYD_PACK:-}" ]; then
  build_dir=$REPLAYD_PACK
  export REPLAYD_PREBUILT=1 LD_LIBRARY_PATH="$REPLAYD_PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
results=tests/gpu/RESULTS.md
logs=$(mktemp -d)
status=0
trap 'rm -rf "$logs"' EXIT

step() {  # step NAME COMMAND...: runs COMMAND, keeps its output as $logs/NAME
  local name=$1
  shift
  echo "== $name: $*" >&2
  if "$@" >"$logs/$name" 2>&1; then
    echo "ok" >"$logs/$name.rc"
  else
    echo "FAILED (exit $?)" >"$logs/$name.rc"
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

if [ -n "${REPLAYD_PACK:-}" ]; then
  step build echo "prebuilt binaries from $REPLAYD_PACK"
else
  step build env BUILD_DIR="$build_dir" bash deploy/build.sh
fi
step gpu nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step driver "$build_dir/tests/cuda_driver_test"
step suite "$build_dir/tests/integration_test" --gtest_filter='Devices/*'
step demo env BUILD_DIR="$build_dir" REPLAYD_DEMO_DEVICE=cuda:0 REPLAYD_DEMO_PORT=7171 bash deploy/demo.sh
step bench_cuda "$build_dir/tests/bench/replayd_device_bench" --device=cuda:0 --runs=7 --iterations=500
step bench_cpu "$build_dir/tests/bench/replayd_device_bench" --device=cpu:0 --runs=7 --iterations=500

{
  echo "# GPU results"
  echo
  echo "Written by \`bash tests/gpu/run.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
  echo "Host: $(nproc) cores; GPU: $(cat "$logs/gpu" 2>/dev/null | head -n 1)."
  section "Build" build 'error|warning|Built target replayd$|prebuilt'
  section "CUDA driver tests (cuda_driver_test)" driver '^\[ *(OK|FAILED|SKIPPED) +\]|^\[ +PASSED +\]|Skipped|Failure'
  section "Device suite (integration_test --gtest_filter='Devices/*')" suite \
    '^\[ *(OK|FAILED) +\]|^\[ +(PASSED|SKIPPED) +\] [0-9]+ test|Failure'
  section "Decode demo on cuda:0 (deploy/demo.sh)" demo
  section "Per-kernel cost on cuda:0 (replayd_device_bench --device=cuda:0)" bench_cuda
  section "The same on cpu:0, for comparison" bench_cpu
} >"$results"
echo "wrote $results" >&2
exit "$status"
