#!/usr/bin/env bash
# Every GPU check in one run, for a lent GPU machine (run on an H100 on 2026-11-27 and two H200s on 2026-11-28:
# benchmarks/results/gpu.md).
# Each check runs under a time limit (all of them together under 10 minutes) and its log is kept; a failing
# check does not stop the others.
#   kernels:   the GPU tests, compute-sanitizer memcheck and racecheck on the attention and elementwise kernels,
#              bench_kernels beside PyTorch's SDPA on the same shapes (the table: kernels.md);
#   calibrate: `calibrate --quick`, the profile it writes;
#   executor:  memcheck on the executor's tests, `run --check` on the small plan (the GPU step against the CPU
#              reference), measured runs with their traces and the comparison with the prediction, the medium
#              plan's also predicted with the calibrated profile; on 2, 4 or 8 GPUs the executor under mpirun, one
#              rank per GPU, its gradient all-reduces through NCCL; and zigzag ring attention, Ulysses sp 2 and
#              Megatron cp over every GPU (sends and all-to-alls through NCCL), and ZeRO-2 with the optimizer on
#              each rank's host.
# Usage: scripts/gpu_check.sh [BIN]   BIN holds trainyard, trainyard_gpu_tests and bench_kernels (default: the
# build/ layout; scripts/gpu_bundle.sh packs them with their libraries for a machine that cannot build).
# Results: $OUT/gpu-check.tgz (or build/gpu-check/), and the summary table on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
bin="${1:-}"
if [ -n "$bin" ] && [ -d "$bin/lib" ]; then  # a bundle: its libraries, the image's CUDA, and NCCL where it is
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$PWD/$bin/lib:/usr/local/cuda/lib64:${nccl:+$nccl:}${LD_LIBRARY_PATH:-}"
  source_dir=$(cat "$bin/source_dir.txt")
  [ -e "$source_dir/tests/data" ] || { mkdir -p "$source_dir/tests" && ln -s "$PWD/tests/data" "$source_dir/tests/data"; }
  if ldd "$bin/trainyard" "$bin/trainyard_gpu_tests" | grep "not found"; then
    echo "gpu_check: libraries missing on this machine (above)" >&2
    exit 1
  fi
fi
trainyard="${bin:-build}/trainyard"
tests="${bin:-build/tests}/trainyard_gpu_tests"
bench="${bin:-build/benchmarks}/bench_kernels"
out="${OUT:-build}"
work="$out/gpu-check"
mkdir -p "$work"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
echo "| check | exit | seconds |" >"$work/summary.md"
echo "|---|---|---|" >>"$work/summary.md"
# check NAME SECONDS COMMAND...: runs it with its output in NAME.log; records the exit status (124: time limit).
# SKIP="NAME ..." leaves checks out (a short lease: those whose code has not changed since their last run).
# Under the device tool the archive is rewritten after each check, so a run cut off at its limit still brings back
# what it did.
check() {
  local name=$1 limit=$2 start
  shift 2
  if [[ " ${SKIP:-} " == *" $name "* ]]; then
    echo "| $name | skipped (SKIP) | |" | tee -a "$work/summary.md"
    return
  fi
  start=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  printf '| %s | %s | %s |\n' "$name" "$rc" "$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')" | tee -a "$work/summary.md"
  [ -n "${OUT:-}" ] && tar czf "$OUT/gpu-check.tgz" -C "$out" gpu-check
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$work/gpu.txt"
check gpu-tests 90 "$tests"
check memcheck-kernels 90 "$sanitizer" --tool memcheck --error-exitcode 3 "$tests" --gtest_filter='GpuAttention.*:GpuElementwise.*'
# GEMM runs inside cuBLASLt, whose internals are not ours to race-check.
check racecheck-kernels 60 "$sanitizer" --tool racecheck --error-exitcode 3 "$tests" --gtest_filter='GpuAttention.Chunk*:GpuElementwise.*'
check memcheck-executor 80 "$sanitizer" --tool memcheck --error-exitcode 3 "$tests" --gtest_filter='GpuExecutor.*'
check calibrate 45 "$trainyard" calibrate --quick --out "$work/calibrated-gpu.json"
# The small plan is the CPU reference's size (at most 5 GFLOP); the medium one is timed against its prediction.
check run-check 40 "$trainyard" run --plan examples/small-ringtrack-gpu.plan.json --device gpu --check
check run-small 40 "$trainyard" run --plan examples/small-ringtrack-gpu.plan.json --device gpu --warmup 2 --steps 3 --trace "$work/measured-small.json"
check run-medium 50 "$trainyard" run --plan examples/medium-ringtrack-gpu.plan.json --device gpu --warmup 2 --steps 3 --trace "$work/measured-medium.json"
# The same step predicted with the profile calibrate just wrote (the loop: calibrate, predict, run, compare).
check run-medium-calibrated 50 "$trainyard" run --plan examples/medium-ringtrack-gpu.plan.json --device gpu --warmup 2 --steps 3 \
  --gpu-profile "$work/calibrated-gpu.json"
# Every scheme the executor runs, on one GPU, against the CPU reference (--check): the small model again, Megatron
# with full recompute and offloaded checkpoints, ZeRO-3 with the optimizer step on the host (cudaLaunchHostFunc)
# and parameters offloaded, ZeRO-2 with activations offloaded, ring-track with its weights streamed from the host,
# FPDT (run on an H200 on 2026-11-28: --check passes).
python3 - "$work" <<'PY'
import json, os, sys
plan = json.load(open("examples/small-ringtrack-gpu.plan.json"))
zero = {"zero_stage": 3, "offload": "optimizer,params", "sp": 1, "cp": 1, "zigzag": False, "chunk": 0, "micro_batch": 1,
        "activation_checkpointing": False, "checkpoint_every": 1}
one_gpu = {
    "megatron": ("megatron", {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "vpp": 1, "micro_batch": 1, "sequence_parallel": False,
                              "recompute": "full", "offload_activations": True}),
    "zero": ("zero", zero),
    "zero2-acts": ("zero", dict(zero, zero_stage=2, offload="acts", activation_checkpointing=True)),
    "ringtrack-stream": ("ringtrack", dict(plan["parameters"], weights="stream", states="dram")),
    # FPDT alone: attention in 4 chunks, its streamed buffers' bytes on the copy engines.
    "fpdt": ("fpdt", dict(zero, zero_stage=1, offload="none", chunk=plan["workload"]["seq_len"] // 4, activation_checkpointing=True)),
}
for name, (scheme, parameters) in one_gpu.items():
    p = dict(plan, scheme=scheme, parameters=parameters)
    json.dump(p, open(os.path.join(sys.argv[1], "one-gpu-" + name + ".plan.json"), "w"))
PY
for scheme in megatron zero zero2-acts ringtrack-stream fpdt; do
  check "run-check-$scheme" 40 "$trainyard" run --plan "$work/one-gpu-$scheme.plan.json" --device gpu --check
  check "run-$scheme" 40 "$trainyard" run --plan "$work/one-gpu-$scheme.plan.json" --device gpu --warmup 1 --steps 3
done
# The host's AdamW steps train: 60 steps on the README's bytes, the loss curve kept (first against last steps);
# with streamed weights each step's visits bring the updated weights in.
check train-zero-host-optimizer 40 "$trainyard" run --plan "$work/one-gpu-zero.plan.json" --device gpu --warmup 0 --steps 60 --text README.md \
  --loss-curve "$work/zero-loss.csv"
check train-ringtrack-stream 40 "$trainyard" run --plan "$work/one-gpu-ringtrack-stream.plan.json" --device gpu --warmup 0 --steps 60 \
  --text README.md --loss-curve "$work/ringtrack-stream-loss.csv"
# HotSPa on one GPU: the tiny mini-batch's groups (head_dim 64: the CUDA attention kernels' width) under ZeRO-1 and Megatron,
# one update per mini-batch; --check against the groups' unchunked steps.
hotspa="--lengths examples/tiny-lengths.txt --model custom:layers=2,hidden=256,heads=4,kv_heads=2,head_dim=64,ffn_hidden=512,vocab=256 --tokens-per-step 512 --micro-batch-tokens 64 --device gpu"
# shellcheck disable=SC2086 # $hotspa is a list of flags
check run-check-hotspa 30 "$trainyard" run $hotspa --hw lab-h100 --switch "32=zero:zero_stage=1;64=megatron" --check
# Several GPUs: the executor on one rank per GPU under mpirun, its gradient all-reduces through NCCL (bootstrapped
# over MPI; NOT RUN ON GPUs before this check): ring-track replicas of the small model, one sequence per GPU.
gpus=$(nvidia-smi --list-gpus | wc -l)
case "$gpus" in
  2) node=tests/data/tiny-node-2.json ;;
  4) node=pcie-a100x4 ;;
  8) node=dgx-h100 ;;
  *) node= ;;
esac
if [ -n "$node" ]; then
  python3 - "$node" "$gpus" "$work/replicas.plan.json" <<'PY'
import json, sys, os
node, gpus, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
plan = json.load(open("examples/small-ringtrack-gpu.plan.json"))
plan["hw"] = node
plan["workload"]["global_batch"] = gpus
json.dump(plan, open(out, "w"))
# The other schemes' sends and all-to-alls through NCCL, the small model again (4 heads, 2 K/V heads).
zero = {"zero_stage": 1, "offload": "none", "sp": 1, "cp": 1, "zigzag": False, "chunk": 0, "micro_batch": 1,
        "activation_checkpointing": False, "checkpoint_every": 1}
others = {
    "ringattention": ("ring-attention", 1, dict(zero, cp=gpus, zigzag=True)),
    "ulysses": ("ulysses", gpus // 2, dict(zero, sp=2)),
    "fpdt": ("fpdt", gpus // 2, dict(zero, sp=2, chunk=plan["workload"]["seq_len"] // 4, activation_checkpointing=True)),
    "megatron-cp": ("megatron", 1, {"tp": 1, "pp": 1, "dp": 1, "cp": gpus, "vpp": 1, "micro_batch": 1, "sequence_parallel": False,
                                    "recompute": "none", "offload_activations": False}),
    # Hierarchical CP: all-to-alls in groups of 2 (the small model's 2 K/V heads), the K/V ring over the groups.
    "megatron-hcp": ("megatron", 1, {"tp": 1, "pp": 1, "dp": 1, "cp": gpus, "cp_comm": "a2a+p2p", "cp_a2a": 2, "vpp": 1, "micro_batch": 1,
                                     "sequence_parallel": False, "recompute": "none", "offload_activations": False}),
    # ZeRO-Offload: each rank's optimizer step on its host (cudaLaunchHostFunc), gradients out and weights back.
    "zero-offload": ("zero", gpus, dict(zero, zero_stage=2, offload="optimizer")),
}
for name, (scheme, batch, parameters) in others.items():
    p = dict(plan, scheme=scheme, parameters=parameters, workload={"seq_len": plan["workload"]["seq_len"], "global_batch": batch})
    json.dump(p, open(os.path.join(os.path.dirname(out), name + ".plan.json"), "w"))
PY
  check run-ranks-nccl 60 mpirun -np "$gpus" --allow-run-as-root "$trainyard" run --plan "$work/replicas.plan.json" --device gpu --warmup 1 --steps 3 --comm-timeout 30
  for scheme in ringattention ulysses fpdt megatron-cp megatron-hcp zero-offload; do
    [ "$scheme" = megatron-hcp ] && [ "$gpus" -lt 4 ] && continue  # two groups of two at least
    check "run-ranks-$scheme" 45 mpirun -np "$gpus" --allow-run-as-root "$trainyard" run --plan "$work/$scheme.plan.json" --device gpu --warmup 1 --steps 3 --comm-timeout 30
  done
  # HotSPa's switches through NCCL ranks: ZeRO-3 for the short group, Megatron tp 2 for the long one.
  # shellcheck disable=SC2086
  check run-ranks-hotspa 45 mpirun -np "$gpus" --allow-run-as-root "$trainyard" run $hotspa --hw "$node" \
    --switch "32=zero:zero_stage=3;64=megatron:tp=2,dp=$((gpus / 2))" --steps 3 --comm-timeout 30
else
  echo "run-ranks-nccl: skipped ($gpus GPUs: the check knows nodes of 2, 4 and 8)" | tee -a "$work/summary.md"
fi
# Real PyTorch profiler traces of a small Llama training job (PyTorch eager, SDPA, a one-rank NCCL all-reduce,
# shapes recorded), for the trace readers and `calibrate --from-trace`: two model sizes, so GEMMs and attention come
# in several shapes.
check kineto-2048 90 python3 scripts/kineto_capture.py "$work/kineto-h2048-s8192.json.gz" --layers 4 --hidden 2048 --heads 16 \
  --kv-heads 8 --ffn 5632 --seq 8192
check kineto-1024 90 python3 scripts/kineto_capture.py "$work/kineto-h1024-s4096.json.gz" --layers 4 --hidden 1024 --heads 8 \
  --kv-heads 8 --ffn 2816 --seq 4096 --batch 2
check bench-kernels 45 "$bench" --benchmark_format=json --benchmark_out="$work/bench_kernels.json" --benchmark_out_format=json
check sdpa 40 python3 scripts/sdpa_bench.py 16384 4096
[ -f "$work/sdpa.log" ] && cp "$work/sdpa.log" "$work/sdpa.jsonl"
python3 scripts/kernels_table.py "$work" >"$work/kernels-table.log" 2>&1 || echo "kernels table: failed (kernels-table.log)"
[ -f "$work/kernels.md" ] && cat "$work/kernels.md"
for log in gpu-tests calibrate run-check run-small run-medium run-medium-calibrated run-check-megatron run-check-zero run-check-zero2-acts \
  run-megatron run-zero run-zero2-acts train-zero-host-optimizer run-check-ringtrack-stream train-ringtrack-stream run-check-fpdt run-fpdt \
  run-check-hotspa kineto-2048 kineto-1024 run-ranks-nccl run-ranks-ringattention run-ranks-ulysses run-ranks-fpdt run-ranks-megatron-cp run-ranks-megatron-hcp run-ranks-hotspa; do
  echo "--- $log (last lines)"
  tail -n 25 "$work/$log.log"
done
grep -h "ERROR SUMMARY" "$work"/memcheck-*.log "$work"/racecheck-*.log
if [ -n "${OUT:-}" ]; then  # the device tool brings back few files: one archive
  tar czf "$OUT/gpu-check.tgz" -C "$out" gpu-check && rm -rf "$work"
fi
