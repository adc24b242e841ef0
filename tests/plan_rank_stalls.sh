#!/bin/bash
# A rank that stops answering ends an MPI plan search with an error naming it, not a hang (app/plan_farm.hpp):
# rank 1 is frozen (SIGSTOP) a second into the search; rank 0 must give up after --rank-timeout and end every rank,
# naming rank 1 (waiting for its results, or for it to take a wave: MpiCommunicator::deliver_sends).
# Usage: plan_rank_stalls.sh TRAINYARD MPIEXEC
set -uo pipefail
trainyard=$1 mpiexec=$2
dir=$(mktemp -d)
frozen=""
trap 'rm -rf "$dir"; [ -z "$frozen" ] || kill -KILL "$frozen" 2>/dev/null' EXIT
timeout 120 "$mpiexec" -np 2 --oversubscribe "$trainyard" plan --model llama3-8b --hw dgx-a100 --seq 1M --rank-timeout 3 \
  > "$dir/out" 2> "$dir/err" &
run=$!
sleep 1
# Only this run's ranks (descendants of its timeout): ctest may run another test's plan ranks beside this one, and
# freezing one of those hangs that test (it did in CI).
descendants() {
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}
frozen=""
for pid in $(descendants "$run"); do
  if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=1$"; then
    kill -STOP "$pid" && frozen=$pid
  fi
done
wait "$run"
rc=$?
cat "$dir/err"
[ -n "$frozen" ] || { echo "FAIL: rank 1 was not found to freeze"; exit 1; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL: exit code $rc (124: it hung until the timeout)"; exit 1; }
grep -qE "receive from rank 1 |to rank 1 \(tag" "$dir/err" || { echo "FAIL: the error does not name rank 1"; exit 1; }
echo "PASS: ended with exit code $rc, naming rank 1"
