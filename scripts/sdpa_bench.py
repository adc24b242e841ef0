#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention (flash backend) on the shapes of benchmarks/bench_kernels.cpp.

Run on the GPU machine beside bench_kernels; prints one JSON object per shape with milliseconds and TFLOP/s,
counted the same way as bench_kernels (causal: the n(n+1)/2 visible pairs; backward 2.5x the forward).
"""
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_ms(fn, repeats=5):
    fn()  # warm-up
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def main():
    heads, dim = 32, 128
    for n in (int(a) for a in (sys.argv[1:] or ["16384", "4096"])):
        q, k, v = (torch.randn(1, heads, n, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fwd_ms = time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            d_o = torch.randn_like(o)
            bwd_ms = time_ms(lambda: torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True))
        flops = 4.0 * heads * dim * n * (n + 1) / 2
        print(json.dumps({"tokens": n, "heads": heads, "head_dim": dim, "forward_ms": fwd_ms, "backward_ms": bwd_ms,
                          "forward_tflops": flops / fwd_ms * 1e-9, "backward_tflops": 2.5 * flops / bwd_ms * 1e-9,
                          "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
