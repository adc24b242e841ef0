#!/usr/bin/env bash
# README command 2: install dependencies, build, and run the whole test suite through ctest.
# GPU tests skip with a reason when no GPU is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export QT_QPA_PLATFORM=offscreen
ctest --test-dir build --output-on-failure -j "$(nproc 2>/dev/null || echo 2)"
