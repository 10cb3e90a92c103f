#!/usr/bin/env bash
# Builds replayd's container image (deploy/Containerfile) with podman, or docker where
# podman is absent: builds the binaries here (deploy/build.sh; the host must be Debian 12,
# as the image is, so that they find the same libraries), stages them with the
# Containerfile in a fresh context directory, and builds the image from it.
#   deploy/build-image.sh [TAG]     # TAG defaults to replayd:latest
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-replayd:latest}

if command -v podman >/dev/null; then
  engine=podman
elif command -v docker >/dev/null; then
  engine=docker
else
  echo "build-image: neither podman nor docker is installed (apt-get install podman)" >&2
  exit 1
fi
. /etc/os-release
if [ "${ID:-}" != debian ] || [ "${VERSION_ID:-}" != 12 ]; then
  echo "build-image: the binaries must be built on Debian 12 to run in the image (this is ${PRETTY_NAME:-unknown})" >&2
  exit 1
fi

build_dir=${BUILD_DIR:-build}
BUILD_TARGETS="replayd replayd-executor replayd-cc replayctl" bash deploy/build.sh

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir "$context/bin"
cp "$build_dir/server/replayd" "$build_dir/server/replayd-executor" "$build_dir/server/replayd-cc" \
   "$build_dir/client/replayctl" "$context/bin/"
cp deploy/Containerfile deploy/replayd.conf.example "$context/"
"$engine" build -t "$tag" -f "$context/Containerfile" "$context"
echo "build-image: built $tag with $engine"
