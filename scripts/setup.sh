#!/usr/bin/env bash
# Installs what deft needs to build its tests and examples on Debian/Ubuntu:
# a C++20 compiler, CMake, xsimd and Boost.Test, and the Fashion-MNIST data set
# (dataset-fashion-mnist, 30 MB, in /usr/share/datasets/fashion-mnist; see
# docs/data.md); for the package checks (ctest -L package) pkg-config and
# Conan 2, which goes into a virtual environment build/conan-venv (from PyPI,
# so nothing touches the system Python); doxygen for the API reference and
# its check that every public name is documented (ctest -L docs).
# With --sanitizers also clang and its sanitizer runtimes, and Ninja (for
# scripts/sanitize.sh). Safe to run again.
set -euo pipefail
packages=(g++ cmake make libxsimd-dev zlib1g-dev libboost-test-dev dataset-fashion-mnist pkg-config python3-venv doxygen libopenmpi-dev openmpi-bin)
if [ "${1:-}" = "--sanitizers" ]; then packages+=(clang libclang-rt-dev ninja-build); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deft setup: installing ${missing[*]}"
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  "${as_root[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Conan (pinned major version: the recipe is written for Conan 2).
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/build/conan-venv"
if [ ! -x "$venv/bin/conan" ]; then
  echo "deft setup: installing conan into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "conan>=2,<3"
fi
echo "deft setup: dependencies present"
