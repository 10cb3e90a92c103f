#!/usr/bin/env bash
# The figures of "Isolation" in docs/performance.md: what --isolation=process costs,
# in-process (A) against isolated (B) in one run of replayd_isolation_bench, and, when
# SPIN0_BUILD names a build whose drivers/executor/channel.cc has kSpins = 0, the
# isolated daemon with the default spin (A) against that build (B), both isolated.
#
# The daemon binaries are copied (with replayd-executor and replayd-cc beside each) to a directory of
# their own first, so a rebuild during the run does not change what is measured.
#
#   tests/bench/isolation.sh                      # BUILD=build RUNS=5 PLACEMENT=split
#   SPIN0_BUILD=/tmp/spin-exp/build tests/bench/isolation.sh [bench flags...]
#
# Arguments are passed to both bench runs (e.g. --iterations=1000). COMMIT names what was
# built when the tree is not a git checkout.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build}
runs=${RUNS:-5}
placement=${PLACEMENT:-split}
bench=$build/tests/bench/replayd_isolation_bench
snap=$(mktemp -d /tmp/replayd-isolation-XXXXXX)
trap 'rm -rf "$snap"' EXIT
mkdir "$snap/default"
cp "$build/server/replayd" "$build/server/replayd-executor" "$build/server/replayd-cc" "$snap/default/"

commit=${COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
echo "commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores"
"$bench" --runs="$runs" --placement="$placement" --replayd="$snap/default/replayd" "$@"

if [ -n "${SPIN0_BUILD:-}" ]; then
  mkdir "$snap/spin0"
  cp "$SPIN0_BUILD/server/replayd" "$SPIN0_BUILD/server/replayd-executor" "$SPIN0_BUILD/server/replayd-cc" "$snap/spin0/"
  echo
  "$bench" --runs="$runs" --placement="$placement" --replayd="$snap/default/replayd" \
    --daemon_args=--isolation=process --b_replayd="$snap/spin0/replayd" --b_args= \
    --a_label=kSpins=4000 --b_label=kSpins=0 "$@"
fi
