#!/usr/bin/env bash
# tests/fuzz/run.sh [SECONDS]: builds the fuzz targets with clang (build-fuzz/, or
# $FUZZ_BUILD_DIR) and runs each for SECONDS (default 60) through ctest, one at a time.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
clang=$(command -v clang++-16 || command -v clang++ || true)
if [ -z "$clang" ]; then
  echo "fuzz: no clang++ (install clang-16 and libclang-rt-16-dev: deploy/install-deps.sh does)" >&2
  exit 1
fi
CC=${clang/clang++/clang} CXX=$clang cmake -S . -B "$build_dir" -DREPLAYD_FUZZ=ON \
  -DREPLAYD_FUZZ_SECONDS="$seconds" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target replayd_fuzzers
ctest --test-dir "$build_dir" --output-on-failure -j 1 -R '^fuzz\.'
