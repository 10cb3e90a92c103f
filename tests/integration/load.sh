#!/usr/bin/env bash
# The load test at full size: 64 clients x 10,000 checked replays each, against a daemon
# process of this build, then its footprint. SOAK=seconds runs each client that long
# instead; ISOLATION=shared runs the tenant's work in the daemon's process.
#
#   tests/integration/load.sh                 # BUILD=build CLIENTS=64 REPLAYS=10000
#   SOAK=600 tests/integration/load.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build}
export REPLAYD_LOAD_CLIENTS=${CLIENTS:-64}
export REPLAYD_LOAD_REPLAYS=${REPLAYS:-10000}
export REPLAYD_LOAD_SECONDS=${SOAK:-0}
export REPLAYD_LOAD_ISOLATION=${ISOLATION:-process}
echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores"
exec "$build/tests/load_test" --gtest_brief=1
