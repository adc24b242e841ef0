#!/usr/bin/env bash
# The kernels' GPU checks in one run, for the GPU machine (built elsewhere: carry build/tests/trainyard_gpu_tests and
# build/benchmarks/bench_kernels). Runs the GPU tests, compute-sanitizer memcheck and racecheck on them,
# bench_kernels and PyTorch's SDPA on the same shapes, and writes the comparison table to $OUT/kernels.md (the
# table for benchmarks/results/kernels.md) with the logs beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build/gpu-check}"
mkdir -p "$out"
tests=build/tests/trainyard_gpu_tests
bench=build/benchmarks/bench_kernels
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
"$tests" 2>&1 | tee "$out/tests.log" | tail -30 || status=1
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  # The attention and elementwise tests; GEMM runs inside cuBLASLt, whose internals are not ours to race-check.
  "$sanitizer" --tool "$tool" --error-exitcode 3 "$tests" --gtest_filter='GpuAttention.*:GpuElementwise.*' >"$out/$tool.log" 2>&1
  rc=$?
  echo "compute-sanitizer $tool: exit $rc ($(grep -c 'ERROR SUMMARY: 0 errors' "$out/$tool.log") clean summaries)"
  [ "$rc" -eq 0 ] || status=1
done
"$bench" --benchmark_format=json --benchmark_out="$out/bench_kernels.json" --benchmark_out_format=json >"$out/bench.log" 2>&1 || status=1
python3 scripts/sdpa_bench.py 16384 4096 >"$out/sdpa.jsonl" 2>"$out/sdpa.err" || status=1
python3 - "$out" <<'PY'
import json, sys, datetime, pathlib, re
out = pathlib.Path(sys.argv[1])
gpu = (out / "gpu.txt").read_text().strip()
ours = {}
for b in json.loads((out / "bench_kernels.json").read_text())["benchmarks"]:
    ours[re.sub(r"/(iterations:\d+|manual_time)", "", b["name"])] = b
sdpa = {}
for line in (out / "sdpa.jsonl").read_text().splitlines():
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
PY
exit "$status"
