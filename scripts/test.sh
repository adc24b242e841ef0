#!/usr/bin/env bash
# README command 2: install dependencies, build, and run the whole test suite through ctest.
# GPU tests skip with a reason when no GPU is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export QT_QPA_PLATFORM=offscreen
status=0
ctest --test-dir build --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" || status=$?
# ctest lists skipped tests without their reason; show the reason each one gave (e.g. "no usable CUDA GPU").
if grep -q "Skipped" build/Testing/Temporary/LastTest.log 2>/dev/null; then
  echo "skip reasons:"
  grep -h -A1 -E "^.*: Skipped$" build/Testing/Temporary/LastTest.log | grep -v -E "Skipped$|^--$" | sort | uniq -c
fi
exit "$status"
