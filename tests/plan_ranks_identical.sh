#!/bin/bash
# The plan search spread over N MPI ranks answers byte for byte as one process (app/plan_farm.hpp): a ranked search,
# a max-seq search, a hot-switching search (--lengths) and validate (one small dataset: validate --fast takes
# minutes under ASan), as --json. Usage: plan_ranks_identical.sh TRAINYARD MPIEXEC N
set -euo pipefail
trainyard=$1 mpiexec=$2 ranks=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
check() {
  local name=$1
  shift
  "$trainyard" "$@" --json > "$dir/$name-1.json"
  "$mpiexec" -np "$ranks" --oversubscribe "$trainyard" "$@" --json --rank-timeout 300 > "$dir/$name-$ranks.json"
  if ! cmp "$dir/$name-1.json" "$dir/$name-$ranks.json"; then
    diff "$dir/$name-1.json" "$dir/$name-$ranks.json" | head -20
    echo "FAIL: $name on $ranks ranks differs from one process"
    exit 1
  fi
  echo "$name: identical on 1 and $ranks ranks"
}
check ranked plan --model llama3.2-1b --hw dgx-a100 --seq 32K --top 5
check max-seq plan --model llama3.2-1b --hw dgx-a100 --seq 32K --objective max-seq --strategies ulysses,megatron
check lengths plan --lengths dist:commoncrawl --model llama3-8b --hw dgx-a100 --tokens-per-step 512K --max-len 64K
check validate validate --fast --only fpdt-seed
echo "PASS"
