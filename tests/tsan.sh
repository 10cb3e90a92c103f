#!/usr/bin/env bash
# tests/tsan.sh: the engine's and the drivers' tests (executor processes included) under
# ThreadSanitizer, as tsan.* in build-tsan/ (or $TSAN_BUILD_DIR). They need no gRPC,
# which Debian builds without ThreadSanitizer; Abseil, whose Mutex guards nearly every
# shared field of the engine, must be built with it, or ThreadSanitizer sees no lock and
# reports every guarded access as a race. So this script fetches the source of the
# Abseil Debian ships (`apt-get source`, into the build directory; its own package lists,
# the system's are not touched), builds it with clang and -fsanitize=thread once, and
# builds replayd against it. The executors and the compiler's cage the tests start are
# the plain build's ($PLAIN_BUILD_DIR, default build/; built here if missing): confined,
# a ThreadSanitizer runtime cannot map its shadow memory.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build_dir=${TSAN_BUILD_DIR:-build-tsan}
plain_dir=${PLAIN_BUILD_DIR:-build}
clang=$(command -v clang++-16 || command -v clang++ || true)
if [ -z "$clang" ]; then
  echo "tsan: no clang++ (install clang-16 and libclang-rt-16-dev: deploy/install-deps.sh does)" >&2
  exit 1
fi
cc=${clang/clang++/clang}
mkdir -p "$build_dir"
build_dir=$(cd "$build_dir" && pwd)
absl_prefix=$build_dir/absl-tsan

if [ ! -f "$absl_prefix/lib/cmake/absl/abslConfig.cmake" ]; then
  src=$build_dir/absl-source
  rm -rf "$src" && mkdir -p "$src/lists/partial"
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  cat >"$src/sources.list" <<SOURCES
deb-src http://deb.debian.org/debian $codename main
deb-src http://deb.debian.org/debian-security $codename-security main
SOURCES
  apt_options=(-o "Dir::Etc::SourceList=$src/sources.list" -o Dir::Etc::SourceParts=/dev/null
               -o "Dir::State::Lists=$src/lists" -q)
  # As root apt would hand the download to its _apt user, who cannot write here.
  [ "$(id -u)" -ne 0 ] || apt_options+=(-o APT::Sandbox::User=root)
  apt-get "${apt_options[@]}" update >/dev/null
  version=$(dpkg-query -W -f='${source:Version}' libabsl-dev 2>/dev/null || true)
  # The version installed if the archive still has it, else the release's own: the
  # sanitized build uses only its own Abseil, so it need not match the system's.
  (cd "$src" && { apt-get "${apt_options[@]}" source --download-only "abseil=$version" >/dev/null 2>&1 ||
                  apt-get "${apt_options[@]}" source --download-only abseil >/dev/null; })
  (cd "$src" && dpkg-source -x ./*.dsc tree >/dev/null)
  CC=$cc CXX=$clang cmake -S "$src/tree" -B "$src/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" -DCMAKE_CXX_STANDARD=20 -DABSL_PROPAGATE_CXX_STD=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DBUILD_TESTING=OFF -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_INSTALL_PREFIX="$absl_prefix" >/dev/null
  cmake --build "$src/build" -j "$(nproc)" >/dev/null
  cmake --install "$src/build" >/dev/null
  rm -rf "$src"
fi

if [ ! -x "$plain_dir/server/replayd-executor" ] || [ ! -x "$plain_dir/server/replayd-cc" ]; then
  cmake -S . -B "$plain_dir" >/dev/null
  cmake --build "$plain_dir" -j "$(nproc)" --target replayd-executor replayd-cc
fi

CC=$cc CXX=$clang cmake -S . -B "$build_dir" -DREPLAYD_SANITIZE=thread -DCMAKE_PREFIX_PATH="$absl_prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target replayd_tsan_tests

plain_dir=$(cd "$plain_dir" && pwd)
export REPLAYD_TEST_EXECUTOR=$plain_dir/server/replayd-executor
export REPLAYD_TEST_CC=$plain_dir/server/replayd-cc
symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1 suppressions=$root/tests/tsan.supp${symbolizer:+ external_symbolizer_path=$symbolizer}}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" -R '^tsan\.'
