#!/usr/bin/env bash
# Builds deft's GPU programs on this machine (nvcc; host code for AVX2, so
# they run on any recent x86-64) into build-gpu/bundle, with the Boost.Test
# library they link and run.sh, which runs all of them on a machine with a
# GPU that has the CUDA runtime but nothing else of deft's (a lent GPU
# machine cannot install packages):
#   scripts/gpu_bundle.sh [CUDA architecture, default 90]
#   then there: build-gpu/bundle/run.sh   (carrying build-gpu/bundle)
# run.sh runs, most telling first, each under a time limit: the
# gpu-labelled tests; ResNet-18 (full width, batch 256) for RESNET_EPOCHS
# epochs (10, the D2L chapter's run) beside PyTorch's for TORCH_EPOCHS (3;
# bench/gpu_torch_resnet.py); the auto-parallel demo and one epoch of the
# MLP trainer on gpu0, cpu,gpu0 and its measured shares; deft_bench_gpu
# (CSV); the tests again under compute-sanitizer's memcheck. At most 10
# minutes in all; it writes eight files under $OUT (./gpu-out without it),
# the most the device tool brings back, and prints a summary last.
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:-90}"
build=build-gpu
bundle="$build/bundle"
./scripts/setup.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDEFT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DDEFT_NATIVE=OFF \
  -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DCMAKE_CUDA_FLAGS=-Xcompiler=-march=x86-64-v3 -DDEFT_BUILD_BENCH=ON \
  -DDEFT_BUILD_EXAMPLES=ON >/dev/null
programs=(tests/gpu/deft_gpu_kernels_device bench/deft_bench_gpu examples/auto_parallel_gpu
          examples/train_fashion_mnist_gpu)
cmake --build "$build" -j2 --target "${programs[@]##*/}"
rm -rf "$bundle"
mkdir -p "$bundle/lib"
for p in "${programs[@]}"; do
  strip -o "$bundle/${p##*/}" "$build/$p"
  gzip -9 "$bundle/${p##*/}"  # a third of the size: the device tool carries 64 MiB in all
  # Boost's libraries: the CUDA runtime and cuBLAS are the GPU machine's own.
  ldd "$build/$p" | awk '/libboost/ {print $3}' | xargs -r cp -Lu -t "$bundle/lib"
done
cp bench/gpu_torch_step.py bench/gpu_torch_resnet.py "$bundle/"
# The trainer's data (30 MB; the bundle stays under the device tool's 64 MiB carry).
cp -r /usr/share/datasets/fashion-mnist "$bundle/"
cat >"$bundle/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs deft's GPU programs (see scripts/gpu_bundle.sh); logs under $OUT.
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-./gpu-out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin="$(mktemp -d)"  # unpacked here, so the bundle stays small enough to carry
trap 'rm -rf "$bin"' EXIT
for z in "$here"/*.gz; do
  gzip -dc "$z" >"$bin/$(basename "${z%.gz}")"
  chmod +x "$bin/$(basename "${z%.gz}")"
done
summary=()
# name, seconds, command...: runs it (killed after that long), records its
# exit status; its output goes to $out/<name up to a colon>.log.
step() {
  local name="$1" limit="$2"
  shift 2
  local start=$SECONDS
  echo "== $*" >>"$out/${name%%:*}.log"
  timeout -k 5 "$limit" "$@" >>"$out/${name%%:*}.log" 2>&1
  local rc=$?  # 124: it ran past its limit
  summary+=("$(printf '%-26s exit %3d  %4d s' "$name" "$rc" $((SECONDS - start)))")
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/misc.log" 2>&1
step gpu_kernels 120 "$bin/deft_gpu_kernels_device" --log_level=test_suite
data="$here/fashion-mnist"
[ -d "$data" ] || data=/usr/share/datasets/fashion-mnist
step resnet_deft 260 "$bin/train_fashion_mnist_gpu" --model resnet18 --device gpu0 --epochs "${RESNET_EPOCHS:-10}" \
  --data "$data" --csv "$out/resnet_deft.csv"
step resnet_torch 60 env PYTHONUNBUFFERED=1 python3 "$here/gpu_torch_resnet.py" "$data" --epochs "${TORCH_EPOCHS:-3}"
step misc:auto_parallel_gpu 30 "$bin/auto_parallel_gpu"
step misc:train:gpu0 30 "$bin/train_fashion_mnist_gpu" --device gpu0 --epochs 1 --data "$data"
step misc:train:cpu,gpu0 30 "$bin/train_fashion_mnist_gpu" --device cpu,gpu0 --epochs 1 --data "$data"
step misc:train:shares 30 "$bin/train_fashion_mnist_gpu" --device cpu,gpu0 --shares auto --epochs 1 --data "$data"
step bench_gpu 90 "$bin/deft_bench_gpu" --csv "$out/gpu_bench.csv" --torch-script "$here/gpu_torch_step.py"
# Out-of-bounds and misaligned accesses in deft's kernels (within a pool
# block it cannot see them: the pool cuts blocks from larger allocations).
# Failed API calls are not counted: the tests provoke out-of-memory on
# purpose, and NCCL probes kernels this GPU has no image for (on an H200
# those were all of the errors reported).
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
step memcheck 120 "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 99 \
  "$bin/deft_gpu_kernels_device" --log_level=test_suite
echo "GPU: $(head -1 "$out/misc.log")"
grep -E "ERROR SUMMARY|Invalid|No errors|failure" "$out/memcheck.log" | head -5
grep -E "Running|No errors|failure|error" "$out/gpu_kernels.log" | tail -5
grep -E "^epoch|accuracy" "$out/resnet_deft.log" | tail -12
grep -E "^epoch" "$out/resnet_torch.log"
tail -15 "$out/bench_gpu.log"
printf '%s\n' "${summary[@]}"
EOF
chmod +x "$bundle/run.sh"
du -sh "$bundle"
