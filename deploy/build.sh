#!/usr/bin/env bash
# Installs missing dependencies and builds replayd into build/ (or $BUILD_DIR): everything,
# or only $BUILD_TARGETS.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" ${CMAKE_ARGS:-} >/dev/null
# BUILD_TARGETS (space-separated) builds only those, e.g. "replayd replayctl" for the demo.
# shellcheck disable=SC2086
cmake --build "$build_dir" -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
