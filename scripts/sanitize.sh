#!/usr/bin/env bash
# The unit tests under sanitizers, host code only (GUI, CUDA and benchmarks off to save time):
#   build-asan: clang, everything built with -fsanitize=address,undefined (-fno-sanitize-recover=undefined: UB fails
#               the test), the whole GoogleTest suite run through ctest; the CLI tests run the ASan-built trainyard.
#               The same directory holds the fuzz targets (scripts/asan_build.sh), so the libraries build once.
#   build-tsan: the tests that start threads in-process and the libraries they use, built with -fsanitize=thread.
#   scripts/sanitize.sh [asan|tsan]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(asan tsan)
jobs=$(nproc 2>/dev/null || echo 2)
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

# TSan runs trainyard_thread_tests (tests/CMakeLists.txt: the tests that start threads in-process) except the one
# that runs the CLI as a child process, which this build does not compile.
tsan_filter='-HotSpaCli.*'
# Left out under ASan, and why: Limits.* hold the CLI to a 4 GiB address-space limit, which ASan's shadow memory
# cannot start under, and to refusal times ASan's slowdown would break (they run in the normal build); the README's
# and the manuals' examples (Docs/, and the README's answer held to the main job) are whole-minute plan searches and
# a calibration sweep whose code the other CLI tests already drive, and would take most of CI's time under ASan;
# Cli.PlanStopsCleanlyOnCtrlC... waits up to a minute for the 1M search to reach a plan, a timing ASan's slowdown
# makes flaky (once, on a loaded machine, its 12 s attempt left no output at all; not reproduced), while
# Interrupt.* drive the same Ctrl-C path under ASan.
# The mpirun tests (mpi_*) run in the ASan build with LeakSanitizer off (tests/CMakeLists.txt says why).
asan_exclude='^Limits\.|^Docs/|^ReadmeFirstScreen\.TheAnswer|^Cli\.PlanStopsCleanlyOnCtrlC'

source scripts/asan_build.sh

for stage in "${stages[@]}"; do
  start=$(date +%s)
  case "$stage" in
    asan)
      configure_asan_build
      cmake --build "$asan_build" -j "$jobs" --target trainyard trainyard_tests trainyard_registry_tests trainyard_mpi_tests
      # Leaks fail the run; UB stops it with a stack.
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest --test-dir "$asan_build" --output-on-failure -j "$jobs" -E "$asan_exclude"
      ;;
    tsan)
      cmake -S . -B build-tsan -DTRAINYARD_SANITIZE=thread -DTRAINYARD_GUI=OFF -DTRAINYARD_CUDA=OFF \
        -DTRAINYARD_BENCHMARKS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
      cmake --build build-tsan -j "$jobs" --target trainyard_thread_tests
      TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 build-tsan/tests/trainyard_thread_tests --gtest_filter="$tsan_filter"
      ;;
    *) echo "sanitize: unknown stage '$stage' (asan or tsan)" >&2; exit 2 ;;
  esac
  echo "sanitize: $stage passed in $(( $(date +%s) - start )) s"
done
