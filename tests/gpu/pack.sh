#!/usr/bin/env bash
# Packs what tests/gpu/run.sh needs on a GPU machine that cannot build replayd (no
# network, no Debian packages): the binaries, stripped, and the shared libraries they
# use beyond glibc, into gpu-pack/ (or $1). There, run
#   REPLAYD_PACK=gpu-pack bash tests/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${BUILD_DIR:-build}
pack=${1:-gpu-pack}
binaries=(server/replayd client/replayctl tests/integration_test tests/cuda_driver_test
          tests/bench/replayd_device_bench)
rm -rf "$pack"
mkdir -p "$pack/lib"
for b in "${binaries[@]}"; do
  mkdir -p "$pack/$(dirname "$b")"
  strip -o "$pack/$b" "$build_dir/$b"
done
for b in "${binaries[@]}"; do ldd "$pack/$b"; done | awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv)\.so|/ld-linux' |
  while read -r lib; do cp -L "$lib" "$pack/lib/"; done
du -sh "$pack"
