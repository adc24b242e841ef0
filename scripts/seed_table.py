#!/usr/bin/env python3
"""Regenerates docs/validation.md: the FPDT seed table (Llama-3 8B on 8 GPUs, "HOW WE GET HERE") simulated on
the DGX A100 profile. For each row: the longest power-of-two sequence that fits (4K..8M, one sequence per
step) and the MFU there, beside the published figures.

Usage: scripts/seed_table.py [path/to/trainyard]   (default build/trainyard); run from the repository root.
It rewrites the table between the markers in docs/validation.md and leaves the rest of the file alone.
"""
import json
import subprocess
import sys

TRAINYARD = sys.argv[1] if len(sys.argv) > 1 else "build/trainyard"

# (label, published max length, published HBM, published MFU, simulate flags or None when not modelled yet)
ROWS = [
    ("TP", "32K", "64.3G", 9.4, ["--strategy", "megatron", "--tp", "8"]),
    ("TP + AC", "128K", "61.2G", 19.4, ["--strategy", "megatron", "--tp", "8", "--recompute", "full"]),
    ("TP + AC + OC", "512K", "78.7G", 32.7,
     ["--strategy", "megatron", "--tp", "8", "--recompute", "full", "--offload", "acts"]),
    ("UL + ZeRO-1", "64K", "58.9G", 15.3, ["--strategy", "ulysses", "--sp", "8", "--zero-stage", "1"]),
    ("UL + ZeRO-2", "64K", "54.5G", 15.3, ["--strategy", "ulysses", "--sp", "8", "--zero-stage", "2"]),
    ("UL + ZeRO-3", "64K", "52.3G", 21.0, ["--strategy", "ulysses", "--sp", "8", "--zero-stage", "3"]),
    ("AC + OC + UL + ZeRO-1", "512K", "65.5G", 46.8,
     ["--strategy", "ulysses", "--sp", "8", "--zero-stage", "1", "--recompute", "full", "--offload", "acts"]),
    ("AC + OC + UL + ZeRO-2", "512K", "65.5G", 46.8,
     ["--strategy", "ulysses", "--sp", "8", "--zero-stage", "2", "--recompute", "full", "--offload", "acts"]),
    ("AC + OC + UL + ZeRO-3", "512K", "60.1G", 47.2,
     ["--strategy", "ulysses", "--sp", "8", "--zero-stage", "3", "--recompute", "full", "--offload", "acts"]),
    ("AC + OC + ZeRO-3 + FPDT", "4M", "68.0G", 55.7,
     ["--strategy", "fpdt", "--sp", "8", "--chunk", "64K", "--zero-stage", "3", "--recompute", "full", "--offload", "acts"]),
]


def simulate(flags, seq_k):
    flags = list(flags)
    if "--chunk" in flags:  # FPDT's 64K chunk, or the whole sequence when it is shorter
        i = flags.index("--chunk") + 1
        flags[i] = f"{min(64, seq_k)}K"
    cmd = [TRAINYARD, "simulate", *flags, "--model", "llama3-8b", "--hw", "dgx-a100", "--seq", f"{seq_k}K",
           "--global-batch", "1", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return json.loads(out.stdout)


def longest(flags):
    best = None
    seq_k = 4
    while seq_k <= 8192:
        result = simulate(flags, seq_k)
        if not result["completed"]:
            break
        best = (seq_k, result)
        seq_k *= 2
    return best


def fmt_len(seq_k):
    return f"{seq_k // 1024}M" if seq_k >= 1024 else f"{seq_k}K"


lines = []
for label, pub_len, pub_hbm, pub_mfu, flags in ROWS:
    if flags is None:
        lines.append(f"| {label} | {pub_len} | {pub_hbm} | {pub_mfu}% | not modelled yet | | | |")
        continue
    best = longest(flags)
    if best is None:
        lines.append(f"| {label} | {pub_len} | {pub_hbm} | {pub_mfu}% | < 4K | | | |")
        continue
    seq_k, result = best
    hbm = max(g["peak_hbm_bytes"] for g in result["per_gpu"]) / 2**30
    mfu = 100 * result["mfu"]
    same_len = "yes" if fmt_len(seq_k) == pub_len else "no"
    within = "yes" if abs(mfu - pub_mfu) <= 0.2 * pub_mfu else "no"
    lines.append(f"| {label} | {pub_len} | {pub_hbm} | {pub_mfu}% | {fmt_len(seq_k)} | {hbm:.1f}G | {mfu:.1f}% | "
                 f"{same_len} / {within} |")
    print(lines[-1], file=sys.stderr)

HEADER = ("| row | published max len | published HBM | published MFU | simulated max len | simulated peak HBM | "
          "simulated MFU | len equal / MFU within 20% |\n|---|---|---|---|---|---|---|---|\n")
table = HEADER + "\n".join(lines) + "\n"
BEGIN, END = "<!-- table:begin -->\n", "<!-- table:end -->"
with open("docs/validation.md") as f:
    doc = f.read()
head, rest = doc.split(BEGIN, 1)
_, tail = rest.split(END, 1)
with open("docs/validation.md", "w") as f:
    f.write(head + BEGIN + table + END + tail)
print(table)
