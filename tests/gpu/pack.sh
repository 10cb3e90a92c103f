#!/usr/bin/env bash
# Packs what tests/gpu/run.sh needs on a GPU machine that cannot build replayd (no
# network, no Debian packages): the binaries, stripped, and the shared libraries they
# use beyond glibc, into gpu-pack/ (or $1). Each binary finds those libraries through its
# RUNPATH ($ORIGIN/../lib and the like, set with patchelf), so that processes started with
# an empty environment (the daemon's executors, its compiler cage) start there too. There, run
#   REPLAYD_PACK=gpu-pack bash tests/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${BUILD_DIR:-build}
pack=${1:-gpu-pack}
binaries=(server/replayd server/replayd-executor server/replayd-cc client/replayctl tests/integration_test
          tests/cuda_driver_test tests/bench/replayd_device_bench)
rm -rf "$pack"
mkdir -p "$pack/lib"
command -v patchelf >/dev/null || { apt-get update -qq && apt-get install -y -qq patchelf >/dev/null; }
for b in "${binaries[@]}"; do
  mkdir -p "$pack/$(dirname "$b")"
  strip -o "$pack/$b" "$build_dir/$b"
  up=$(dirname "$b" | sed -E 's#[^/]+#..#g')  # server -> .., tests/bench -> ../..
  patchelf --force-rpath --set-rpath "\$ORIGIN/$up/lib" "$pack/$b"  # DT_RPATH: their libraries' too
done
for b in "${binaries[@]}"; do ldd "$pack/$b"; done | awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv)\.so|/ld-linux' |
  while read -r lib; do cp -L "$lib" "$pack/lib/"; done
du -sh "$pack"
