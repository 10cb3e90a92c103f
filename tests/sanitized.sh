#!/usr/bin/env bash
# tests/sanitized.sh: the unit tests that need no daemon (the engine's, the drivers',
# executor processes included, and the server's parts) under AddressSanitizer and
# UndefinedBehaviorSanitizer, as asan.* in the fuzz build (build-fuzz/, or
# $FUZZ_BUILD_DIR, configured as tests/fuzz/run.sh configures it), whose libraries carry
# both. Left out: the tests that start confined children (the executor's, the compiler
# cage's), whose sanitizer runtimes need what the confinement forbids (terabytes of
# address space, /proc), and the integration suite, which runs daemons: a second build of
# everything with the sanitizers does not fit CI's time (docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
clang=$(command -v clang++-16 || command -v clang++ || true)
if [ -z "$clang" ]; then
  echo "sanitized: no clang++ (install clang-16 and libclang-rt-16-dev: deploy/install-deps.sh does)" >&2
  exit 1
fi
CC=${clang/clang++/clang} CXX=$clang cmake -S . -B "$build_dir" -DREPLAYD_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target replayd_sanitized_tests
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" -R '^asan\.' \
  -E '^asan\.(ExecutorDriverTest|Faults/ExecutorFaultTest|CompilerCageTest|Cage/)'
