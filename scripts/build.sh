#!/usr/bin/env bash
# Configures and builds trainyard into build/ (warnings are errors) with every part the README promises required:
# the GUI always, the CUDA code wherever the toolkit is installed. A missing dependency fails configure with the
# Debian package to install, instead of a part being skipped in silence.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
# nvcc is often installed but not on PATH: let CMake find it in the usual place.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cuda=OFF
command -v nvcc >/dev/null && cuda=ON
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAINYARD_WERROR=ON -DTRAINYARD_GUI=ON -DTRAINYARD_CUDA=$cuda "$@"
cmake --build build -j "$jobs"
