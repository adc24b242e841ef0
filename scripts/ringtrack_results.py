#!/usr/bin/env python3
"""Regenerates the result tables of docs/ringtrack.md from the simulator: ring-track against FPDT, Ulysses and ring
attention on the built-in profiles. Every number comes from `trainyard simulate`.

Usage: scripts/ringtrack_results.py [path/to/trainyard]   (default build/trainyard); run from the repository root.
It rewrites the text between <!-- results:begin --> and <!-- results:end --> in docs/ringtrack.md.

Each scheme is tried in a few configurations (listed in VARIANTS, shown in the doc) and the one with the best
MFU that fits is reported; issue 6's planner searches these spaces properly.
"""
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

TRAINYARD = sys.argv[1] if len(sys.argv) > 1 else "build/trainyard"
K = 1024

# Per scheme: the configurations tried. "{g}" is the GPU count of the node.
VARIANTS = {
    "ringtrack": [
        ["--strategy", "ringtrack", "--ring", "{g}", "--chunk", "16K", "--kv", "dram", "--acts", "recompute", "--states", "hbm"],
        ["--strategy", "ringtrack", "--ring", "{g}", "--chunk", "16K", "--kv", "dram", "--acts", "recompute", "--states", "dram"],
        ["--strategy", "ringtrack", "--ring", "{g}", "--chunk", "16K", "--kv", "dram", "--acts", "dram", "--states", "dram"],
    ],
    "fpdt": [
        ["--strategy", "fpdt", "--sp", "{g}", "--chunk", "64K", "--zero-stage", "3", "--recompute", "full", "--offload", "acts"],
        ["--strategy", "fpdt", "--sp", "{g}", "--chunk", "64K", "--zero-stage", "3", "--recompute", "full",
         "--offload", "acts,optimizer"],
    ],
    "ulysses": [
        ["--strategy", "ulysses", "--sp", "{g}", "--zero-stage", "3", "--recompute", "full", "--offload", "acts"],
        ["--strategy", "ulysses", "--sp", "{g}", "--zero-stage", "3", "--recompute", "full", "--offload", "acts,optimizer"],
    ],
    "ring-attention": [
        ["--strategy", "ring-attention", "--cp", "{g}", "--zigzag", "--zero-stage", "3", "--recompute", "full", "--offload", "acts"],
        ["--strategy", "ring-attention", "--cp", "{g}", "--zigzag", "--zero-stage", "3", "--recompute", "full",
         "--offload", "acts,optimizer"],
    ],
}
LABEL = {"ringtrack": "RT", "fpdt": "FP", "ulysses": "UL", "ring-attention": "RA"}
GPUS = {"dgx-a100": 8, "pcie-4090x8": 8, "lab-h100": 1, "lab-h200": 1}


def simulate(flags, model, hw, seq_k):
    flags = [f.replace("{g}", str(GPUS[hw])) for f in flags]
    if "--chunk" in flags and "fpdt" in flags:  # FPDT's chunk cannot exceed the sequence
        i = flags.index("--chunk") + 1
        flags[i] = f"{min(64, seq_k)}K"
    cmd = [TRAINYARD, "simulate", *flags, "--model", model, "--hw", hw, "--seq", f"{seq_k}K", "--global-batch", "1", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode == 2:  # a configuration this hardware cannot take (e.g. --sp larger than the heads allow)
        return None
    if out.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return json.loads(out.stdout)


def best(scheme, model, hw, seq_k):
    """The completed variant with the highest MFU: (result, variant index), or (None, None)."""
    found = (None, None)
    for i, flags in enumerate(VARIANTS[scheme]):
        r = simulate(flags, model, hw, seq_k)
        if r and r["completed"] and (found[0] is None or r["mfu"] > found[0]["mfu"]):
            found = (r, i)
    return found


def max_length(scheme, model, hw, start_k=64, stop_k=16 * K):
    """Longest power-of-two sequence that fits (from start_k), with its best result."""
    last = (None, None, None)
    seq_k = start_k
    while seq_k <= stop_k:
        r, i = best(scheme, model, hw, seq_k)
        if r is None:
            break
        last = (seq_k, r, i)
        seq_k *= 2
    return last


def fmt_len(seq_k):
    return f"{seq_k // K}M" if seq_k >= K else f"{seq_k}K"


def gib(b):
    return f"{b / 2**30:.1f}"


def peak_hbm(r):
    return max(g["peak_hbm_bytes"] for g in r["per_gpu"])


def peak_dram(r):
    return max(n["peak_dram_bytes"] for n in r["per_node"])


def max_cells(scheme, seq_k, r, i, floor):
    """Table cells for a max-length result: length, config, MFU, peak HBM, peak DRAM."""
    if seq_k is None:
        return f"< {floor} | | | |"
    return f"{fmt_len(seq_k)} | {LABEL[scheme]}{i + 1} | {100 * r['mfu']:.1f}% | {gib(peak_hbm(r))} | {gib(peak_dram(r))}"


def comparison(model, hw, lengths_k, schemes):
    jobs = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for s in schemes:
            jobs[("max", s)] = pool.submit(max_length, s, model, hw)
            for L in lengths_k:
                jobs[(L, s)] = pool.submit(best, s, model, hw, L)
        rows = ["| length | scheme | config | step time | MFU | peak HBM/GPU (GiB) | peak DRAM/node (GiB) |",
                "|---|---|---|---|---|---|---|"]
        for L in lengths_k:
            for s in schemes:
                r, i = jobs[(L, s)].result()
                if r is None:
                    rows.append(f"| {fmt_len(L)} | {s} | – | does not fit | | | |")
                else:
                    rows.append(f"| {fmt_len(L)} | {s} | {LABEL[s]}{i + 1} | {r['step_ns'] / 1e9:.1f} s | {100 * r['mfu']:.1f}% | "
                                f"{gib(peak_hbm(r))} | {gib(peak_dram(r))} |")
        rows.append("")
        rows.append("| scheme | max trainable length | config | MFU there | peak HBM/GPU (GiB) | peak DRAM/node (GiB) |")
        rows.append("|---|---|---|---|---|---|")
        for s in schemes:
            rows.append(f"| {s} | {max_cells(s, *jobs[('max', s)].result(), floor='64K')} |")
    return rows


def chunk_sweep(model, hw, seq_k):
    rows = ["| chunk | step time | MFU | peak HBM/GPU (GiB) | exposed transfer, mean per GPU | peak DRAM/node (GiB) |",
            "|---|---|---|---|---|---|"]
    chunks = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    flags = ["--strategy", "ringtrack", "--ring", "{g}", "--kv", "dram", "--acts", "recompute", "--states", "hbm"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = [pool.submit(simulate, flags + ["--chunk", f"{c}K"], model, hw, seq_k) for c in chunks]
        for c, fut in zip(chunks, results):
            r = fut.result()
            if r is None or not r["completed"]:
                rows.append(f"| {c}K | does not fit | | | | |")
                continue
            exposed = sum(g["exposed_transfer_ns"] for g in r["per_gpu"]) / len(r["per_gpu"]) / 1e9
            rows.append(f"| {c}K | {r['step_ns'] / 1e9:.1f} s | {100 * r['mfu']:.1f}% | {gib(peak_hbm(r))} | {exposed:.1f} s | "
                        f"{gib(peak_dram(r))} |")
    return rows


def variants_table():
    rows = ["| config | flags |", "|---|---|"]
    for s, vs in VARIANTS.items():
        for i, flags in enumerate(vs):
            rows.append(f"| {LABEL[s]}{i + 1} | `{' '.join(flags)}` |")
    return rows


four = ["ringtrack", "fpdt", "ulysses", "ring-attention"]
lengths = [256, 512, K, 2 * K, 4 * K]
out = ["### Configurations tried (the best that fits is reported; {g} = GPUs of the node)", "", *variants_table(), "",
       "### 1. DGX A100 (8x A100 80GB), Llama-3 8B, one sequence per step", "",
       *comparison("llama3-8b", "dgx-a100", lengths, four), "",
       "### 2. 8x RTX 4090 PCIe server (no NVLink, 24 GB per GPU)", "", "#### Llama-3.2 3B", "",
       *comparison("llama3.2-3b", "pcie-4090x8", lengths, four), "", "#### Llama-3 8B", "",
       *comparison("llama3-8b", "pcie-4090x8", lengths, four), ""]
for hw in ("lab-h100", "lab-h200"):
    out += [f"### 3. One GPU with 128 GiB of host DRAM: {hw}", "", "| model | scheme | max trainable length | config | MFU there | "
            "peak HBM (GiB) | peak DRAM (GiB) |", "|---|---|---|---|---|---|---|"]
    for model in ("llama3.2-1b", "llama3-8b"):
        for s in ("ringtrack", "fpdt"):
            out.append(f"| {model} | {s} | {max_cells(s, *max_length(s, model, hw, start_k=16), floor='16K')} |")
    out.append("")
out += ["### 4. Chunk size: ring-track on the DGX A100, Llama-3 8B at 1M tokens (config RT1 with --chunk varied)", "",
        *chunk_sweep("llama3-8b", "dgx-a100", K)]

path = "docs/ringtrack.md"
with open(path) as f:
    doc = f.read()
begin, end = "<!-- results:begin -->", "<!-- results:end -->"
head, rest = doc.split(begin)
_, tail = rest.split(end)
with open(path, "w") as f:
    f.write(head + begin + "\n" + "\n".join(out) + "\n" + end + tail)
print("\n".join(out))
