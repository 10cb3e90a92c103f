#!/usr/bin/env bash
# deploy/replayd.service passes `systemd-analyze verify` without a word: verify exits 0
# even on unknown keys and bad values, so any output fails the test. The unit's ExecStart
# is pointed at the built replayd, as verify checks that the program exists. A copy with
# a broken line must draw a complaint, so that a silent verify means something.
#   systemd_unit_test.sh UNIT REPLAYD_BINARY       (exit 77: skipped, no systemd-analyze)
set -euo pipefail
unit=$1 replayd=$2
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze is not installed"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

verify() {  # prints what systemd-analyze verify says of unit file $1, and its exit status
  local out rc=0
  out=$(cd "$dir" && SYSTEMD_LOG_COLOR=0 systemd-analyze verify "$1" 2>&1) || rc=$?
  printf '%s' "$out"
  [ "$rc" -eq 0 ] || printf '\n(exit %s)' "$rc"
}

sed "s#/usr/local/bin/replayd#$replayd#" "$unit" > "$dir/replayd.service"
said=$(verify "$dir/replayd.service")
if [ -n "$said" ]; then
  echo "FAIL: systemd-analyze verify $unit:"
  echo "$said"
  exit 1
fi

mkdir "$dir/broken"
sed 's/^KillSignal=SIGTERM$/KillSignal=SIGNOTASIGNAL/' "$dir/replayd.service" > "$dir/broken/replayd.service"
said=$(verify "$dir/broken/replayd.service")
if ! grep -q SIGNOTASIGNAL <<<"$said"; then
  echo "FAIL: systemd-analyze verify said nothing of a bad KillSignal, so its silence proves nothing: $said"
  exit 1
fi
echo "PASS: systemd-analyze verify accepts $unit and refuses a bad KillSignal"
