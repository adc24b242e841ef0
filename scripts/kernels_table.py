#!/usr/bin/env python3
"""The kernels' table for benchmarks/results/kernels.md from a GPU check's folder (scripts/gpu_check.sh):
bench_kernels' JSON beside PyTorch SDPA's lines (scripts/sdpa_bench.py). Writes FOLDER/kernels.md and prints it."""
import json, sys, datetime, pathlib, re
out = pathlib.Path(sys.argv[1])
gpu = (out / "gpu.txt").read_text().strip()
ours = {}
for b in json.loads((out / "bench_kernels.json").read_text())["benchmarks"]:
    ours[re.sub(r"/(iterations:\d+|manual_time)", "", b["name"])] = b
sdpa = {}
for line in (out / "sdpa.jsonl").read_text().splitlines():
    if not line.startswith("{"):
        continue
    r = json.loads(line); sdpa[r["tokens"]] = r
rows = ["| kernel | shape | ours ms | ours TFLOP/s | SDPA ms | SDPA TFLOP/s | ours / SDPA | target |", "|---|---|---|---|---|---|---|---|"]
for kind, key, target in (("Forward", "forward", 0.5), ("Backward", "backward", 0.4)):
    for n in (16384, 4096):
        b = ours.get(f"BM_Attention{kind}/{n}/0")
        s = sdpa.get(n)
        if not b or not s:
            continue
        ratio = b["TFLOP/s"] / s[f"{key}_tflops"]
        rows.append(f"| attention {key}, tensor cores | q=kv={n}, 32 heads, d128, causal | {b['real_time']:.2f} | {b['TFLOP/s']:.0f} | "
                    f"{s[f'{key}_ms']:.2f} | {s[f'{key}_tflops']:.0f} | {ratio:.2f} | >= {target} |")
copy = ours.get("BM_CopyDeviceToDevice/268435456")
for name in ("BM_SwiGluForward/134217728", "BM_RmsNormForward/16384"):
    b = ours.get(name)
    if b and copy:
        rows.append(f"| {name.split('/')[0][3:]} | {name.split('/')[1]} | {b['real_time']:.3f} | {b['GB/s']:.0f} GB/s | copy {copy['real_time']:.3f} | "
                    f"{copy['GB/s']:.0f} GB/s | {b['GB/s'] / copy['GB/s']:.2f} | >= 0.8 |")
text = f"Measured {datetime.date.today()} on {gpu}\n\n" + "\n".join(rows) + "\n"
(out / "kernels.md").write_text(text)
print(text)
