#!/usr/bin/env bash
# Installs missing dependencies, builds, and runs every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/build.sh
build_dir=${BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 600
