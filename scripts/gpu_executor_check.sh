#!/usr/bin/env bash
# The first GPU checks of the CUDA executor, for the GPU machine (built here: carry build/trainyard and
# build/tests/trainyard_gpu_tests; check `ldd` there first). The executor has never run on a GPU: expect to debug.
#   1. the executor's GPU tests (a step against the CPU reference, an optimizer step), then compute-sanitizer
#      memcheck on them (the arena offsets and event waits are the likely faults);
#   2. `run --check` on the tiny plan (GPU step against the CPU reference);
#   3. a measured run with the measured trace and the comparison with the prediction.
# Logs go to $OUT (or build/gpu-executor-check); the last lines are a summary table.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build/gpu-executor-check}"
mkdir -p "$out"
tests=build/tests/trainyard_gpu_tests
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
"$tests" --gtest_filter='GpuExecutor.*' >"$out/tests.log" 2>&1; tests_rc=$?
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
"$sanitizer" --tool memcheck --error-exitcode 3 "$tests" --gtest_filter='GpuExecutor.*' >"$out/memcheck.log" 2>&1; memcheck_rc=$?
build/trainyard run --plan examples/tiny-ringtrack.plan.json --device gpu --check >"$out/check.log" 2>&1; check_rc=$?
build/trainyard run --plan examples/tiny-ringtrack.plan.json --device gpu --warmup 2 --steps 3 --trace "$out/measured.json" \
  >"$out/run.log" 2>&1; run_rc=$?
printf '| check | exit |\n|---|---|\n| GpuExecutor tests | %s |\n| memcheck | %s |\n| run --check | %s |\n| measured run | %s |\n' \
  "$tests_rc" "$memcheck_rc" "$check_rc" "$run_rc" | tee "$out/summary.md"
tail -5 "$out/tests.log" "$out/check.log" "$out/run.log"
