#!/usr/bin/env bash
# Configures and builds trainyard into build/ (warnings are errors). CUDA and Qt parts are built when found.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
# nvcc is often installed but not on PATH: let CMake find it in the usual place.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAINYARD_WERROR=ON "$@"
cmake --build build -j "$jobs"
