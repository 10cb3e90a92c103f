#!/usr/bin/env bash
# The container image (deploy/Containerfile) installs every Debian package whose shared
# libraries the binaries it copies load: each library ldd finds is traced to its package
# (dpkg -S), and each package must be in the Containerfile's apt-get install (those the
# base image has too, such as libc6, so the list is whole), and each package it names must
# be in the archive (apt-cache show). Runs where the binaries were built,
# which deploy/build-image.sh requires to be Debian 12, as the image is.
#   container_deps_test.sh CONTAINERFILE BINARY...     (exit 77: skipped, not Debian)
set -euo pipefail
containerfile=$1
shift
if ! command -v dpkg >/dev/null; then
  echo "SKIP: no dpkg: not a Debian system"
  exit 77
fi
# The packages the Containerfile installs: the words after "apt-get install" up to "&&".
installed=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$containerfile" |
  grep -o 'apt-get install[^&]*' | tr ' ' '\n' | grep -v -e '^-' -e '^apt-get$' -e '^install$' -e '^$' | sort -u)

# Every library the binaries load, and the package of each: one dpkg -S over every path
# a library may be known to dpkg by (as ldd names it, resolved, with and without /usr).
declare -A used_by=()
for binary in "$@"; do
  if ldd "$binary" | grep -q 'not found'; then
    echo "FAIL: $binary lacks libraries here:"; ldd "$binary" | grep 'not found'; exit 1
  fi
  for lib in $(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'); do
    used_by[$lib]+="$(basename "$binary") "
  done
done
variants() { local real; real=$(readlink -f "$1"); printf '%s\n' "$1" "$real" "${real#/usr}" "/usr$real"; }
declare -A owner=()
while IFS= read -r line; do
  owner[${line#*: }]=${line%%:*}
done < <(for lib in "${!used_by[@]}"; do variants "$lib"; done | sort -u | xargs dpkg -S 2>/dev/null || true)

missing=()
for lib in "${!used_by[@]}"; do
  package=
  for path in $(variants "$lib"); do
    package=${owner[$path]:-}
    [ -n "$package" ] && break
  done
  if [ -z "$package" ]; then
    echo "FAIL: no package holds $lib"
    exit 1
  fi
  grep -qx "$package" <<<"$installed" || missing+=("$package ($(basename "$lib") of ${used_by[$lib]% })")
done
# Every package it names is one Debian 12 has (where apt's package lists are here to ask).
if compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
  for package in $installed; do
    apt-cache show "$package" >/dev/null 2>&1 || missing+=("$package (named, but not in the archive)")
  done
else
  echo "note: no apt package lists here; the packages' names are not checked against the archive"
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "FAIL: $containerfile does not install:"
  printf '  %s\n' "${missing[@]}" | sort -u
  exit 1
fi
echo "PASS: $containerfile installs the packages of every library of $*"
