#!/usr/bin/env bash
# run_one.sh BINARY SEED_CORPUS SECONDS: runs one fuzz target for SECONDS over its seed
# corpus, writing the inputs it finds to a scratch directory (the corpus in the repository
# stays as it is). A crash, a leak or a failed check fails the run and leaves the input in
# the current directory.
set -euo pipefail
binary=$1 corpus=$2 seconds=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$corpus"
"$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
  "$scratch" "$corpus" 2>&1 | tail -n 30
