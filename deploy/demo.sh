#!/usr/bin/env bash
# The demo job on a fresh Debian 12 machine: install what is missing, build, start
# replayd on loopback with the CPU device (or $REPLAYD_DEMO_DEVICE, e.g. cuda:0), run
# `replayctl demo`, stop the daemon. $REPLAYD_DEMO_FLAGS go to the daemon (for example
# --isolation=shared); the daemon's log is kept in $REPLAYD_DEMO_LOG when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the daemon and the client: the test suite is not needed to run the demo.
[ -n "${REPLAYD_PREBUILT:-}" ] || BUILD_TARGETS="replayd replayctl" bash deploy/build.sh
build_dir=${BUILD_DIR:-build}
port=${REPLAYD_DEMO_PORT:-7070}
device=${REPLAYD_DEMO_DEVICE:-cpu:0}
cache_dir=$(mktemp -d)
log=${REPLAYD_DEMO_LOG:-$(mktemp)}
"$build_dir/server/replayd" --listen "127.0.0.1:$port" --devices "${device%%:*}" \
  --cache_dir "$cache_dir" --log_level warn ${REPLAYD_DEMO_FLAGS:-} >"$log" 2>&1 &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  rm -rf "$cache_dir"
  [ -n "${REPLAYD_DEMO_LOG:-}" ] || rm -f "$log"
}
trap cleanup EXIT
for _ in $(seq 100); do
  "$build_dir/client/replayctl" --target "127.0.0.1:$port" devices >/dev/null 2>&1 && break
  kill -0 "$daemon" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
"$build_dir/client/replayctl" --target "127.0.0.1:$port" devices
echo
"$build_dir/client/replayctl" --target "127.0.0.1:$port" --device "$device" demo
