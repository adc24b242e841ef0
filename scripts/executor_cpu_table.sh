#!/usr/bin/env bash
# The loop plan -> predict -> run -> measure -> compare -> calibrate, on this machine's CPU: calibrates the CPU
# device (`trainyard calibrate --device cpu`), then runs each plan below with the executor on the CPU device
# (`trainyard run --device cpu --gpu-profile <that profile>`, 1 warm-up step, the median of 3 measured steps) and
# records predicted against measured (step time, per task class, peak memory) in benchmarks/results/executor_cpu.md.
# The plans are ones the executor runs so far (one GPU, model states resident): ring-track over chunk sizes, offload
# policies, batch, width and depth; Megatron and ZeRO with and without recompute; FPDT; a micro-batch of 2 sequences. Then plans of 4 GPUs under
# mpirun -np 4, predicted on the node and collective library `mpirun -np 4 trainyard calibrate --device cpu` wrote,
# and on the plan's node; and HotSPa's two groups and switches on those ranks. Usage: scripts/executor_cpu_table.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
md=benchmarks/results/executor_cpu.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
"$build/trainyard" calibrate --device cpu --out "$tmp/cpu-here.json" > "$tmp/calibrate.txt" 2>&1
# Several ranks: every rank's sweep at once, then the ranks' messages and collectives (a node and a collective library).
mpirun -np 4 --oversubscribe "$build/trainyard" calibrate --device cpu --out "$tmp/cpu4.json" > "$tmp/calibrate4.txt" 2>&1
python3 - "$build/trainyard" "$tmp" "$md" <<'PY'
import json, subprocess, sys, datetime, platform, os, statistics
trainyard, tmp, md = sys.argv[1:]
tiny = "custom:layers=2,hidden=64,heads=4,kv_heads=2,head_dim=16,ffn_hidden=192,vocab=256"
wide = "custom:layers=2,hidden=128,heads=8,kv_heads=4,head_dim=16,ffn_hidden=384,vocab=256"
deep = "custom:layers=4,hidden=64,heads=4,kv_heads=2,head_dim=16,ffn_hidden=192,vocab=256"
def ringtrack(chunk, kv, acts, prefetch):
    return ("ringtrack", {"ring": 1, "block": 1, "chunk": chunk, "prefetch": prefetch, "kv": kv, "acts": acts, "weights": "resident",
                          "states": "hbm", "ring_order": []}, f"ring-track chunk {chunk}, K/V {kv}, acts {acts}, prefetch {prefetch}")
def megatron(recompute, offload):
    return ("megatron", {"tp": 1, "pp": 1, "dp": 1, "vpp": 1, "micro_batch": 1, "sequence_parallel": False, "recompute": recompute,
                         "offload_activations": offload}, f"Megatron recompute {recompute}" + (", checkpoints offloaded" if offload else ""))
def zero(checkpointing):
    return ("zero", {"zero_stage": 0, "sp": 1, "cp": 1, "zigzag": False, "chunk": 0, "micro_batch": 1, "activation_checkpointing": checkpointing,
                     "checkpoint_every": 1, "offload": "none"}, "ZeRO" + (", activation checkpointing" if checkpointing else ""))
def batched(plan):  # one micro-batch of 2 sequences
    scheme, params, label = plan
    return (scheme, dict(params, micro_batch=2), label + ", micro-batch 2")
def fpdt(chunk):  # FPDT alone on one GPU: attention in chunks, its streamed buffers' bytes on the copy streams
    return ("fpdt", dict(zero(True)[1], chunk=chunk), f"FPDT chunk {chunk}, activation checkpointing")
# (model, seq, batch, (scheme, parameters, label))
plans = [
    (tiny, 256, 1, ringtrack(64, "dram", "dram", 2)),
    (tiny, 256, 1, ringtrack(128, "dram", "dram", 2)),
    (tiny, 256, 1, ringtrack(256, "hbm", "hbm", 2)),
    (tiny, 256, 1, ringtrack(64, "hbm", "recompute", 2)),
    (tiny, 512, 1, ringtrack(64, "dram", "dram", 2)),
    (tiny, 512, 1, ringtrack(128, "dram", "recompute", 1)),
    (tiny, 256, 2, ringtrack(64, "dram", "dram", 2)),
    (wide, 256, 1, ringtrack(64, "dram", "dram", 2)),
    (wide, 256, 1, ringtrack(128, "hbm", "hbm", 2)),
    (deep, 256, 1, ringtrack(32, "dram", "dram", 1)),
    (deep, 384, 1, ringtrack(128, "dram", "hbm", 2)),
    (tiny, 256, 2, megatron("none", False)),
    (tiny, 256, 2, megatron("full", True)),
    (wide, 256, 1, zero(False)),
    (deep, 256, 2, zero(True)),
    (tiny, 256, 1, fpdt(64)),
    (tiny, 256, 2, batched(megatron("none", False))),
]
rows = []
for i, (model, seq, batch, (scheme, params, label)) in enumerate(plans):
    plan = {"format": "trainyard.plan.v1", "model": model, "hw": "lab-h100", "nodes": 1, "precision": "bf16-mixed",
            "workload": {"seq_len": seq, "global_batch": batch}, "scheme": scheme, "parameters": params}
    path = os.path.join(tmp, f"plan{i}.json")
    json.dump(plan, open(path, "w"))
    out = subprocess.run([trainyard, "run", "--plan", path, "--device", "cpu", "--warmup", "1", "--steps", "3",
                          "--gpu-profile", os.path.join(tmp, "cpu-here.json"), "--json"], check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    measured = statistics.median(s["step_ns"] for s in r["steps"])
    predicted = r["predicted"]["step_ns"]
    cls = {c["what"]: c for c in r["comparison"]["by_class"]}
    def err(name):
        c = cls.get(name)
        return "" if c is None else f"{100 * c['error']:+.0f}%"
    name = {tiny: "tiny", wide: "wide", deep: "deep"}[model]
    rows.append((f"{name} seq {seq} x{batch}, {label}",
                 predicted / 1e6, measured / 1e6, (predicted - measured) / measured, err("gemm"), err("attention fwd"),
                 err("attention bwd"), err("elementwise"), err("H2D"), err("D2H"),
                 r["predicted"]["peak_hbm_bytes"] / 2**20, r["measured"]["peak_hbm_bytes"] / 2**20))
errors = [abs(r[3]) for r in rows]

# Plans of 4 GPUs under mpirun -np 4, predicted twice: on the calibrated node of 4 ranks with the MPI collective
# library, and (as before that calibration existed) on the plan's node with NCCL and the calibrated device only.
def ranks_run(path, flags):
    out = subprocess.run(["mpirun", "-np", "4", "--oversubscribe", trainyard, "run", "--plan", path, "--device", "cpu", "--warmup", "1",
                          "--steps", "3", "--json"] + flags, check=True, capture_output=True, text=True).stdout
    return json.loads(out)
calibrated = ["--hw", os.path.join(tmp, "cpu4-node.json"), "--collectives", os.path.join(tmp, "cpu4-mpi.json")]
def variant(example, **changes):
    plan = json.load(open(f"examples/{example}.plan.json"))
    plan["parameters"].update(changes)
    return plan
rank_plans = [("ring-track ring 2 x 2 replicas", json.load(open("examples/tiny-ringtrack-4ranks.plan.json"))),
              ("Megatron pp 2 x dp 2, full recompute, checkpoints offloaded", json.load(open("examples/tiny-megatron-4ranks.plan.json"))),
              ("Megatron pp 2 x cp 2", json.load(open("examples/tiny-megatron-cp-4ranks.plan.json"))),
              ("Megatron tp 2 x dp 2", json.load(open("examples/tiny-megatron-tp-4ranks.plan.json"))),
              ("Megatron tp 2 x dp 2, sequence parallelism", json.load(open("examples/tiny-megatron-sp-4ranks.plan.json"))),
              ("ZeRO-1 dp 4, activation checkpointing", json.load(open("examples/tiny-zero1-4ranks.plan.json"))),
              ("ring attention cp 4", json.load(open("examples/tiny-ringattention1-4ranks.plan.json"))),
              ("ring attention zigzag cp 2 x dp 2, ZeRO-1", variant("tiny-ringattention-zigzag-4ranks", zero_stage=1, offload="none")),
              ("Ulysses sp 2 x dp 2, ZeRO-1", variant("tiny-ulysses-4ranks", zero_stage=1, offload="none")),
              ("ZeRO-3 dp 4, optimizer on the host, checkpoints offloaded", json.load(open("examples/tiny-zero-4ranks.plan.json"))),
              ("Ulysses sp 2 x dp 2, ZeRO-3, optimizer on the host", json.load(open("examples/tiny-ulysses-4ranks.plan.json"))),
              ("FPDT sp 2 x dp 2 (4 chunks), ZeRO-3, optimizer on the host", json.load(open("examples/tiny-fpdt-4ranks.plan.json"))),
              ("Megatron cp 4 by a2a+p2p (2 groups of 2)", json.load(open("examples/tiny-megatron-hcp-4ranks.plan.json")))]
rank_rows = []
for i, (label, plan) in enumerate(rank_plans):
    path = os.path.join(tmp, f"ranks{i}.json")
    json.dump(plan, open(path, "w"))
    on_ranks = ranks_run(path, calibrated)
    on_plan_node = ranks_run(path, ["--gpu-profile", os.path.join(tmp, "cpu4.json")])
    measured = statistics.median(s["step_ns"] for s in on_ranks["steps"])
    cls = {c["what"]: c for c in on_ranks["comparison"]["by_class"]}
    def class_ms(name):
        c = cls.get(name)
        return "" if c is None else f"{c['predicted_ns'] / 1e6:.1f} / {c['measured_ns'] / 1e6:.1f}"
    w = plan["workload"]
    rank_rows.append((f"{label} (seq {w['seq_len']} x{w['global_batch']})", on_plan_node["predicted"]["step_ns"] / 1e6,
                      on_ranks["predicted"]["step_ns"] / 1e6, measured / 1e6, class_ms("p2p"), class_ms("collective")))
# HotSPa (run --lengths --switch) on the 4 ranks: each group's step and the switches against the mini-batch
# predicted on the calibrated node and collective library.
hotspa_model = "custom:layers=2,hidden=32,heads=4,kv_heads=2,head_dim=8,ffn_hidden=48,vocab=256"
hotspa = json.loads(subprocess.run(
    ["mpirun", "-np", "4", "--oversubscribe", trainyard, "run", "--lengths", "examples/tiny-lengths.txt", "--model", hotspa_model,
     "--tokens-per-step", "512", "--micro-batch-tokens", "64", "--device", "cpu", "--steps", "3", "--json",
     "--switch", "32=zero:zero_stage=3;64=megatron:tp=2,dp=2"] + calibrated, check=True, capture_output=True, text=True).stdout)
hotspa_rows = []
for k, g in enumerate(hotspa["groups"]):
    measured = statistics.median(s["group_step_ns"][k] for s in hotspa["steps"]) / 1e6
    hotspa_rows.append((f"group {g['lo']}~{g['hi']}: {g['scheme']} {g['summary']}, {g['rows']} rows of {g['row_len']}", g["predicted_s"] * 1e3, measured))
hotspa_rows.append(("switches (measured: wall time on rank 0; predicted: exposed)", hotspa["switches"]["predicted_exposed_s"] * 1e3,
                    statistics.median(s["switch_s"] for s in hotspa["steps"]) * 1e3))
hotspa_rows.append(("mini-batch (measured: wall time, each group's executor set up)", hotspa["minibatch"]["predicted_s"] * 1e3,
                    statistics.median(s["seconds"] for s in hotspa["steps"]) * 1e3))
cal = open(os.path.join(tmp, "calibrate.txt")).read()
load = os.getloadavg()
lines = ["# The executor on the CPU device: predicted against measured", "",
         f"Generated by `scripts/executor_cpu_table.sh` on {datetime.date.today()} ({platform.machine()}, {os.cpu_count()} hardware threads, "
         f"load average {load[0]:.2f} at the end). Each plan: `trainyard run --device cpu --warmup 1 --steps 3 --gpu-profile P`, "
         "the executor (backend/executor.hpp) on the CPU device (streams as threads, the CPU references as kernels), predicted by the "
         "simulator on the `trainyard` stack with the profile P that `trainyard calibrate --device cpu` measured on this machine just before. "
         "Measured step: the median of the 3 measured steps. Error = (predicted - measured) / measured.", "",
         "| plan (1 GPU) | predicted ms | measured ms | step error | GEMM | attn fwd | attn bwd | elementwise | H2D | D2H | peak MiB predicted | peak MiB measured |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for r in rows:
    lines.append(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {100 * r[3]:+.1f}% | {r[4]} | {r[5]} | {r[6]} | {r[7]} | {r[8]} | {r[9]} | {r[10]:.1f} | {r[11]:.2f} |")
lines += ["", f"Step time: mean absolute error {100 * statistics.mean(errors):.1f}%, largest {100 * max(errors):.1f}% over {len(rows)} plans.", "",
          "What the errors say (read from the per-class columns):", "",
          f"- GEMM and attention are what calibration fits (by FLOPs) and carry most of the step; the measured step is longer than "
          f"predicted on {sum(r[3] < 0 for r in rows)} of {len(rows)} plans. Not yet investigated; two candidates: the GEMM curve is "
          "fitted by FLOPs alone while the references' loops run at a speed that depends on the shape and the transposes (a step's "
          "weight gradients are a third of its GEMMs and read their inputs transposed; the sweep has two such shapes of 24), and the "
          "copy streams' threads take a core from the compute stream on a 2-core machine.",
          "- Elementwise ops and the optimizer step: the CPU device's kernels are the references' loops (widening bf16 to float, "
          "computing in double, rounding back), far slower than a copy. Until 2026-11-28 they were predicted at the profile's memory "
          "rate (a memcpy's) and came out about -99% (elementwise) and -95% (AdamW); the sweep now times them and the profile carries "
          "their own rates (`elementwise_GBps`, `optimizer_GBps`: the calibration's `elementwise:` line below). What stays short in the elementwise "
          "column is per task, not per byte: a step's elementwise tasks move a few KiB each, and the stream's wake-ups around them cost "
          "more than the kernels. The GPU's fused kernels do run near memory speed, and its profiles have no such figures.",
          "- Copies are tiny here (KiBs) and cost mostly the stream's queueing and wake-up, which the profile's per-copy cost does not carry.",
          "- Peak memory is predicted 10-40% below what the executor holds: its figure adds per-task scratch (attention partials) and "
          "its arena's alignment and fragmentation to the tensors and states the simulator counts. Before the ring-track fix of "
          "2026-11-27 (a K/V stream buffer was sized for a whole 64K-token block when fewer chunks precede it) the offloaded plans "
          "were predicted at 26 MiB against 3 MiB.",
          "", "Repeatability (2026-11-27, this 2-core VM): four runs of the first 11 plans minutes apart gave step-time mean absolute "
          "errors of 17.0%, 18.9%, 21.0% and 39.7%; two runs of all 15 plans, after the ring-track memory fix, 23.5% and 26.2%; then, with the sweep's trials queued behind a gate, 18.7%; this table's run, on 2026-11-28, gave the figure above. The first "
          "plan's prediction stayed at 105-112 ms while its measured step went from 127 to 219 ms: the machine's noise, not the "
          "calibration, makes most of the spread; a quiet machine and more measured steps would narrow it. With the shorter sweep "
          "first tried (5 trials of 20 ms per point instead of 9 of 50 ms) two runs gave 33% and 23%, with errors changing sign.",
          "", "On 2026-11-28 the same step (the tiny Megatron plan above, one binary, one schedule) measured 283-295 ms in some "
          "minutes and 445-460 ms in others, every task about 1.6x slower together, the wall clock agreeing: the VM's two hardware "
          "threads run at two speeds. A calibration made in one and runs made in the other are 40-60% apart, which is what the "
          "larger errors in these tables mostly are (this table's Megatron and ZeRO rows, and the run of the same day that gave a "
          "35.3% mean).",
          "", "## Several ranks", "",
          "Each plan under `mpirun -np 4 trainyard run --device cpu --warmup 1 --steps 3` (4 processes on this machine's "
          f"{os.cpu_count()} hardware threads), the executor on every rank. Predicted on the ranks: `--hw NODE --collectives LIB`, the node "
          "of 4 ranks and the MPI collective library that `mpirun -np 4 trainyard calibrate --device cpu` wrote just before (its GPU "
          "profile measured with every rank sweeping at once, its links from the executor's own MPI messages and collectives). Predicted "
          "on the plan's node: `--gpu-profile` of that calibration only, the plan's node (pcie-a100x4) and NCCL's costs, as every "
          "multi-rank prediction was made before the ranks' links were measured. p2p and collective: predicted / measured ms summed over "
          "the ranks' tasks (a measured receive includes its wait for the sender).", "",
          "| plan (4 GPUs, 4 ranks) | predicted on the plan's node ms | predicted on the ranks ms | measured ms | error on the plan's node | error on the ranks | p2p ms | collective ms |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
for r in rank_rows:
    lines.append(f"| {r[0]} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:.2f} | {100 * (r[1] - r[3]) / r[3]:+.1f}% | {100 * (r[2] - r[3]) / r[3]:+.1f}% | {r[4]} | {r[5]} |")
rank_errors = [abs(r[2] - r[3]) / r[3] for r in rank_rows]
node_errors = [abs(r[1] - r[3]) / r[3] for r in rank_rows]
lines += ["", f"Step time over {len(rank_rows)} plans: mean absolute error {100 * statistics.mean(rank_errors):.1f}% on the ranks "
          f"(largest {100 * max(rank_errors):.1f}%), {100 * statistics.mean(node_errors):.1f}% on the plan's node.", "",
          "What the several-rank errors say:", "",
          "- The ranks' links are no longer what is missing. Predicted on the plan's node (NVLink-less PCIe GPUs, NCCL's "
          "microsecond latencies) messages and all-reduces cost almost nothing; on the calibrated node a message costs the "
          "executor's measured 60-100 us at 4 ranks (10 us at 2), yet the p2p column's predictions stay well below the "
          "measured sums, which also hold each receive's wait for its sender. The collective column's measured sums are far "
          "larger than predicted for the same reason: a rank's all-reduce starts when its own stream reaches it and ends when "
          "the slowest member's does, while the simulator starts it when every member is there.",
          "- The compute streams are what is left. Measured, a rank's compute stream takes 2-3x its prediction on these tiny "
          "models (32-64 tokens, hidden 32): their kernels last microseconds, and the stream's wake-ups after each event wait "
          "(a thread woken by another) and the elementwise tasks' per-task costs (as on one rank) cost more than the kernels the "
          "calibration times back to back. With 4 ranks on 2 hardware threads the ranks also take turns on the cores, which "
          "a simulator of 4 independent devices cannot see; at 2 ranks the errors are about the same (2026-11-28, plans "
          "on the `mpirun -np 2` calibrated node: ZeRO-1 dp 2 -63% to -72%, Megatron cp 2 -82%, ring attention cp 2 -76%), so the "
          "per-kernel overheads, not the sharing, carry most of it.",
          "- Before 2026-11-28 the executor all-reduced each parameter's gradient on its own (6 MPI calls for a layer's "
          "bucket, one in the simulator's graph); a group's gradients are now one buffer and one all-reduce. Measured "
          "steps fell with it (e.g. ZeRO-1 dp 4 from 21.9 to 15.2 ms, Megatron pp 2 x dp 2 from 14.5 to 11.0 ms, one run each).",
          "", "### HotSPa on the 4 ranks", "",
          "`mpirun -np 4 trainyard run --lengths examples/tiny-lengths.txt --switch \"32=zero:zero_stage=3;64=megatron:tp=2,dp=2\" "
          "--tokens-per-step 512 --micro-batch-tokens 64 --steps 3` (backend/hotspa_step.hpp), predicted on the same calibrated node "
          "and collective library (the mini-batch as `simulate --lengths` runs it, on the `trainyard` stack). Medians of the 3 "
          f"mini-batches; {hotspa['switches']['sent_bytes'] / 1024:.1f} KiB sent in the switches of the last one.", "",
          "| part | predicted ms | measured ms | error |", "|---|---:|---:|---:|"]
for label, predicted, measured in hotspa_rows:
    lines.append(f"| {label} | {predicted:.2f} | {measured:.2f} | {100 * (predicted - measured) / measured:+.1f}% |")
lines += ["", "The groups' steps are short like the plans above, and short for the same reasons. The switches are predicted "
          "to hide behind the group before them (the parameters' sends overlap it where memory allows) while the executor runs "
          "them between the groups, in one order on every rank; and the measured mini-batch also builds each group's schedule "
          "and arenas, which the prediction does not count.",
          "", "Streamed weights and offloaded gradients run on the CPU reference executor, which is untimed, so plans with them are not here.",
          "", "The calibrations these tables used (one rank; then 4 ranks):", "", "```", cal.strip(), "```", "",
          "```", open(os.path.join(tmp, "calibrate4.txt")).read().strip(), "```", ""]
open(md, "w").write("\n".join(lines))
print("\n".join(lines[:20]))
PY
