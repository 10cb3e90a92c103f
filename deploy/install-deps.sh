#!/usr/bin/env bash
# Installs every build and test dependency of replayd from Debian 12's archive.
# Idempotent: packages already present are left alone and apt is not touched.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libssl-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libc-ares-dev libre2-dev zlib1g-dev
  libamdhip64-dev libseccomp-dev
  clang-16 libclang-rt-16-dev
  # the sanitized tests: readable reports, and Abseil's source for ThreadSanitizer (tests/tsan.sh)
  llvm-16 dpkg-dev
  python3-grpcio python3-protobuf python3-numpy python3-pytest python3-dev
  # the deployment files' checks (tests/deploy)
  systemd yamllint python3-yaml
  libcpp-httplib-dev prometheus
  # the rehearsal of the GPU checks (tests/gpu/rehearse_test.sh packs binaries as for a GPU machine)
  patchelf
)
# kubectl for tests/deploy: Debian's, unless one is installed already (a newer one stays).
command -v kubectl >/dev/null || packages+=(kubernetes-client)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
