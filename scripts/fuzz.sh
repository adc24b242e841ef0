#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, clang, -fsanitize=fuzzer,address,undefined) in build-asan and runs
# each one, one at a time, from its seed corpus (tests/fuzz/corpus/<target>/). Any crash, leak, timeout (10 s per
# input) or RSS above 2 GiB fails the script; the input is kept in build-asan/fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh [--ci] [--seconds N] [--runs N] [target ...]
#     --ci         60 seconds per target (CI)
#     --seconds N  at most N seconds per target (default 60)
#     --runs N     at most N executions per target (default: no limit)
#     target       e.g. plan_file (default: all of them)
# Prints per target: executions, seconds, coverage (cov, ft) from libFuzzer's final stats.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
runs=-1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ci) seconds=60 ;;
    --seconds) seconds="$2"; shift ;;
    --runs) runs="$2"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "fuzz: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1") ;;
  esac
  shift
done

source scripts/asan_build.sh
build=$asan_build
configure_asan_build
all=$(ls tests/fuzz/fuzz_*.cpp | sed 's|.*/fuzz_||; s|\.cpp$||')
[ ${#targets[@]} -gt 0 ] || read -r -a targets <<< "$(echo $all)"
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target fuzz_regression_tests $(printf 'fuzz_%s ' "${targets[@]}")
# The inputs found so far (tests/data/fuzz/) must be clean InputErrors in this instrumented build too.
"$build/tests/fuzz/fuzz_regression_tests" --gtest_brief=1

out="$build/fuzz"
mkdir -p "$out/tmp"
export TMPDIR="$PWD/$out/tmp"  # the targets write their input here for the loaders that take a path
failed=()
printf '%-18s %10s %8s %7s %7s  %s\n' target executions seconds cov ft result
for t in "${targets[@]}"; do
  work="$out/corpus/$t"
  artifacts="$out/artifacts/$t/"
  log="$out/$t.log"
  mkdir -p "$work" "$artifacts"
  start=$(date +%s)
  status=0
  nice -n 10 "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -runs="$runs" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$artifacts" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 || status=$?
  elapsed=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  result=ok
  if [ "$status" -ne 0 ]; then
    result="FAILED (exit $status; $log, inputs in $artifacts)"
    failed+=("$t")
  fi
  printf '%-18s %10s %8s %7s %7s  %s\n' "$t" "${execs:-?}" "$elapsed" "${cov:-?}" "${ft:-?}" "$result"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in: ${failed[*]}" >&2
  for t in "${failed[@]}"; do grep -m3 -E 'ERROR|==[0-9]+==|runtime error|terminate|what\(\)' "$out/$t.log" >&2 || true; done
  exit 1
fi
