#!/usr/bin/env bash
# tests/sanitized.sh: the unit tests that need no daemon (the engine's, the drivers',
# executor processes included, and the server's parts) under AddressSanitizer and
# UndefinedBehaviorSanitizer, as asan.* in the fuzz build (build-fuzz/, or
# $FUZZ_BUILD_DIR, configured as tests/fuzz/run.sh configures it), whose libraries carry
# both. The executors and the compiler's cage those tests start are the plain build's
# ($PLAIN_BUILD_DIR, default build/; built here if missing): confined, a sanitizer's
# runtime cannot have what it needs (terabytes of address space, /proc), and the code
# under test is the daemon's side. Left out: the integration suite, which runs daemons:
# a second build of everything with the sanitizers does not fit CI's time
# (docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
plain_dir=${PLAIN_BUILD_DIR:-build}
clang=$(command -v clang++-16 || command -v clang++ || true)
if [ -z "$clang" ]; then
  echo "sanitized: no clang++ (install clang-16 and libclang-rt-16-dev: deploy/install-deps.sh does)" >&2
  exit 1
fi
CC=${clang/clang++/clang} CXX=$clang cmake -S . -B "$build_dir" -DREPLAYD_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target replayd_sanitized_tests
if [ ! -x "$plain_dir/server/replayd-executor" ] || [ ! -x "$plain_dir/server/replayd-cc" ]; then
  cmake -S . -B "$plain_dir" >/dev/null
  cmake --build "$plain_dir" -j "$(nproc)" --target replayd-executor replayd-cc
fi
plain_dir=$(cd "$plain_dir" && pwd)
export REPLAYD_TEST_EXECUTOR=$plain_dir/server/replayd-executor
export REPLAYD_TEST_CC=$plain_dir/server/replayd-cc
symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
[ -z "$symbolizer" ] || export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$symbolizer}
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" -R '^asan\.'
