#!/usr/bin/env bash
# Builds deft's Conan package and runs its test_package, offline:
#   scripts/conan_create.sh [CONAN] [WORK_DIR]
# A throwaway CONAN_HOME under WORK_DIR (default build/conan) keeps the user's
# own Conan setup untouched; ConanCenter is disabled and xsimd and zlib come
# from the system: the recipes xsimd/system and zlib/system
# (scripts/conan/*-system) are exported first and
# scripts/conan/debian12.profile puts them in place of xsimd and zlib.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
conan="${1:-conan}"
work="${2:-$src/build/conan}"
export CONAN_HOME="$work/conan_home"
rm -rf "$CONAN_HOME"
mkdir -p "$CONAN_HOME"
"$conan" --version
"$conan" profile detect --force >"$work/profile_detect.log" 2>&1 || { cat "$work/profile_detect.log"; exit 1; }
"$conan" remote disable conancenter >/dev/null
log="$work/conan_create.log"
for system in xsimd-system zlib-system; do
  "$conan" export "$src/scripts/conan/$system" >"$work/export.log" 2>&1 || { cat "$work/export.log"; exit 1; }
done
if ! "$conan" create "$src" --profile:all "$src/scripts/conan/debian12.profile" --build=missing >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "conan create failed (full log: $log)"
  exit 1
fi
# The test package must really have run and printed the right values.
grep "deft test_package: c = \[3, 3\]" "$log" || { tail -n 60 "$log"; echo "conan create: test_package printed no result"; exit 1; }
grep -E "^deft/[0-9.]+: Package '[0-9a-f]+' (created|built)" "$log" || grep -E "deft/[0-9.]+.*(Package|package) '" "$log" | tail -2
echo "conan create: deft packaged and test_package passed"
