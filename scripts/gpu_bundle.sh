#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh runs on a lent GPU machine into build/gpu-bundle (stripped binaries and the
# shared libraries the machine's image lacks), so a machine that cannot build or install anything runs this
# commit's code: build here, carry build/gpu-bundle, run `scripts/gpu_check.sh build/gpu-bundle` there.
# Left out (the GPU image has its own, and they are too big to carry): the C/C++ runtime, CUDA's libraries and
# NCCL (gpu_check.sh finds the image's; PyTorch's wheel ships one).
# Usage: scripts/gpu_bundle.sh [BUILD_DIR]   (default build/, configured with CUDA)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
bundle="$build/gpu-bundle"
rm -rf "$bundle"
mkdir -p "$bundle/lib"
for binary in "$build/trainyard" "$build/tests/trainyard_gpu_tests" "$build/benchmarks/bench_kernels"; do
  [ -x "$binary" ] || { echo "gpu_bundle: $binary is missing: build with CUDA first (scripts/build.sh)" >&2; exit 1; }
  strip -o "$bundle/$(basename "$binary")" "$binary"
done
# Every library the loader resolves here except the C/C++ runtime and CUDA's (the image's are newer or the same).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|libcuda\.|libcublas|libcudart|libnccl)'
for binary in "$bundle"/trainyard "$bundle"/trainyard_gpu_tests "$bundle"/bench_kernels; do
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] || cp -L "$path" "$bundle/lib/$name"
done
# The GPU tests read tests/data by the path they were compiled with; gpu_check.sh links it there if it is absent.
echo "$PWD" >"$bundle/source_dir.txt"
du -sh "$bundle"
