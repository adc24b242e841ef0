#!/usr/bin/env bash
# trainyard's simulation against Calculon's analytic model on the same Megatron cases, in one run: the time per
# configuration of each and both predictions (benchmarks/results/planner.md, "A peer").
#
# Calculon is not part of trainyard: fetch calculon-ai/calculon (targeted: caa4b11f8fe1fee3ba57adaacb7590d7deabd053)
# into a folder of its own, with Debian's python3-numpy, python3-pandas and python3-psutil installed.
# Usage: benchmarks/peer/calculon/run.sh CALCULON_DIR [TRAINYARD] [RUNS]
#   TRAINYARD: the binary (build/trainyard); RUNS: whole trainyard processes per case, median taken (3).
# The 8B model file is ours (Calculon has no Llama: GeLU MLP with Llama 3 8B's widths, multi-head attention); the
# 1T and 175B models and the A100 system are Calculon's own files.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
calculon="$(cd "${1:?usage: run.sh CALCULON_DIR [TRAINYARD] [RUNS]}" && pwd)"
trainyard="${2:-build/trainyard}"
runs="${3:-3}"
python=/usr/bin/python3
system="$calculon/systems/a100_80g.json"
for f in "$system" "$calculon/models/megatron-1T.json" "$calculon/models/gpt3-175B.json"; do
  [ -f "$f" ] || { echo "run.sh: $f not found: is $calculon a Calculon checkout?" >&2; exit 2; }
done

last_out_file=$(mktemp)
trap 'rm -f "$last_out_file"' EXIT
# Median wall seconds of `runs` runs of a command; its last output kept in $last_out_file.
median_wall() {
  local walls=() start end
  for _ in $(seq "$runs"); do
    start=$(date +%s.%N)
    "$@" >"$last_out_file" 2>&1 || { cat "$last_out_file" >&2; exit 1; }
    end=$(date +%s.%N)
    walls+=("$(echo "$end - $start" | bc -l)")
  done
  printf '%s\n' "${walls[@]}" | sort -g | awk '{w[NR] = $1} END {print w[int((NR + 1) / 2)]}'
}

gpt3="--stack megatron-lm-gpt3-2022 --hw dgx-a100 --seq 2048 --micro-batch 1 --recompute full --tp 8"
declare -A ty_args=(
  [1t]="--model custom:layers=128,hidden=25600,heads=160,kv_heads=160,ffn_hidden=102400,vocab=51200,activation=gelu --nodes 384 --pp 64 --global-batch 3072 $gpt3"
  [175b]="--model custom:layers=96,hidden=12288,heads=96,kv_heads=96,ffn_hidden=49152,vocab=51200,activation=gelu --nodes 128 --pp 16 --global-batch 1536 $gpt3"
  [8b]="--model llama3-8b --hw dgx-a100 --nodes 1 --seq 8K --tp 8 --global-batch 8 --micro-batch 1 --recompute full"
)
declare -A cl_model=([1t]="$calculon/models/megatron-1T.json" [175b]="$calculon/models/gpt3-175B.json" [8b]="$here/model_llama3_8b_like.json")
declare -A label=([1t]="1T, 3,072 A100, TP 8 PP 64 DP 6" [175b]="175B, 1,024 A100, TP 8 PP 16 DP 8" [8b]="Llama 3 8B at 8K, 8 A100, TP 8")

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); trainyard: median of $runs whole processes"
echo
echo "| case | trainyard step | trainyard tasks | trainyard s per configuration | Calculon step | Calculon ms per configuration | time ratio |"
echo "|---|---|---|---|---|---|---|"
for c in 1t 175b 8b; do
  # shellcheck disable=SC2086
  wall=$(median_wall "$trainyard" simulate --strategy megatron ${ty_args[$c]})
  step=$(grep -oP '^step time +\K[0-9.]+ ms' "$last_out_file")
  tasks=$(grep -oP '^step time .*\(\K[0-9]+(?= tasks)' "$last_out_file")
  peer=$("$python" "$here/calculon_eval.py" "$calculon" "${cl_model[$c]}" "$here/exe_$c.json" "$system")
  read -r peer_step peer_ms < <("$python" -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["step_s"], d["eval_ms"])' "$peer")
  printf '| %s | %s | %s | %.2f | %.0f ms | %.2f | %.0f |\n' "${label[$c]}" "$step" "$tasks" "$wall" "$(echo "$peer_step * 1000" | bc -l)" \
    "$peer_ms" "$(echo "$wall * 1000 / $peer_ms" | bc -l)"
done
