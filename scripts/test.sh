#!/usr/bin/env bash
# README command 2: install dependencies, build, and run the whole test suite through ctest (the GUI's QTest suite
# offscreen included). GPU tests skip with a reason when no GPU is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The layout .clang-format describes, before anything builds (scripts/check_format.sh --fix applies it).
bash scripts/check_format.sh
bash scripts/build.sh

# The parts this build has, against the parts the README promises: the GUI always, CUDA where the toolkit is.
parts=build/trainyard_parts.txt
[ -f "$parts" ] || { echo "test: $parts is missing: configure did not finish" >&2; exit 1; }
echo "parts built: $(tr '\n' ' ' < "$parts")"
grep -q '^gui=ON$' "$parts" || { echo "test: the GUI was not built, but the README promises it" >&2; exit 1; }
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  grep -q '^cuda=ON$' "$parts" || { echo "test: the CUDA toolkit is installed but the CUDA code was not built" >&2; exit 1; }
fi

export QT_QPA_PLATFORM=offscreen
status=0
ctest --test-dir build --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" || status=$?
# ctest lists skipped tests without their reason; show the reason each one gave (e.g. "no usable CUDA GPU").
if grep -q "Skipped" build/Testing/Temporary/LastTest.log 2>/dev/null; then
  echo "skip reasons:"
  grep -h -A1 -E "^.*: Skipped$" build/Testing/Temporary/LastTest.log | grep -v -E "Skipped$|^--$" | sort | uniq -c
fi
[ "$status" -eq 0 ] || exit "$status"

# The unit tests under ASan+UBSan (every test but the timing-bound Limits and the README's whole-minute searches) and
# under TSan (the tests that start threads in-process); then a 60-second run of every libFuzzer target, in the same
# ASan build, with the inputs found so far as regression tests. Measured here (2 shared cores, ccache
# partly warm): asan 13 min (build and tests), tsan 5 min; the fuzz stage about 12 min.
bash scripts/sanitize.sh asan tsan
bash scripts/fuzz.sh --ci
