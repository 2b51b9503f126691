#!/usr/bin/env bash
# Installs the competitors deft_bench compares against (all optional: a row
# whose library is missing is skipped with a note) and matplotlib for
# scripts/plot_bench.py. Debian 12 / Ubuntu; safe to run again.
#   Eigen 3.4 (Array, Tensor + ThreadPool)  libeigen3-dev
#   xtensor 0.24 (with xsimd)               libxtensor-dev
#   OpenBLAS (cblas_sgemm)                  libopenblas-dev
#   libtorch C++ API 1.13 (large, ~1 GB)    libtorch-dev
# Set DEFT_BENCH_NO_TORCH=1 to skip libtorch.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/setup.sh"
packages=(libeigen3-dev libxtensor-dev libopenblas-dev pkg-config python3-pip)
[ "${DEFT_BENCH_NO_TORCH:-0}" = 1 ] || packages+=(libtorch-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo)
if ((${#missing[@]})); then
  echo "deft bench setup: installing ${missing[*]}"
  "${as_root[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! python3 -c "import matplotlib" 2>/dev/null; then
  echo "deft bench setup: installing matplotlib (pip)"
  python3 -m pip install -q matplotlib 2>/dev/null || python3 -m pip install -q --break-system-packages matplotlib
fi
echo "deft bench setup: competitors present"
