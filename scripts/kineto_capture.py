#!/usr/bin/env python3
"""Writes a real PyTorch profiler (Kineto) trace of a small Llama-style training job, for trainyard's trace
readers and `calibrate --from-trace` (run on a lent GPU machine: scripts/gpu_check.sh calls it).

The job is what an engine's eager step does, written out in plain PyTorch so nothing but torch is needed:
RMSNorm, grouped-query attention through scaled_dot_product_attention (FlashAttention's kernels), SwiGLU, bf16
weights, a data-parallel gradient all-reduce through NCCL (one rank: the collective kernels and their metadata are
real, the traffic is not), fused AdamW. The profiler records shapes (record_shapes) so GEMMs can be fitted by shape.

Usage: kineto_capture.py OUT.json.gz --layers 4 --hidden 2048 --heads 16 --kv-heads 8 --ffn 5632 --seq 8192
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--bucket-mib", type=int, default=25, help="gradient all-reduce bucket, as DDP's default")
    return p.parse_args()


class Block(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = a.heads, a.kv_heads, a.hidden // a.heads
        self.norm1 = torch.nn.RMSNorm(a.hidden)
        self.qkv = torch.nn.Linear(a.hidden, (a.heads + 2 * a.kv_heads) * self.head_dim, bias=False)
        self.out = torch.nn.Linear(a.heads * self.head_dim, a.hidden, bias=False)
        self.norm2 = torch.nn.RMSNorm(a.hidden)
        self.gate_up = torch.nn.Linear(a.hidden, 2 * a.ffn, bias=False)
        self.down = torch.nn.Linear(a.ffn, a.hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
        q = rope(q.view(b, s, self.heads, self.head_dim), cos, sin).transpose(1, 2)
        k = rope(k.view(b, s, self.kv_heads, self.head_dim), cos, sin).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.kv_heads != self.heads:  # grouped-query attention as torchtitan's llama does it: K/V repeated
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Model(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = torch.nn.Embedding(a.vocab, a.hidden)
        self.blocks = torch.nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = torch.nn.RMSNorm(a.hidden)
        self.head = torch.nn.Linear(a.hidden, a.vocab, bias=False)
        head_dim = a.hidden // a.heads
        angle = torch.outer(torch.arange(a.seq).float(),
                            1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("cos", angle.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angle.sin()[None, :, None, :], persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def all_reduce_gradients(model, bucket_bytes):
    """DDP's bucketing by hand: gradients flattened into buckets of about bucket_bytes, each all-reduced."""
    bucket, size = [], 0
    for p in reversed(list(model.parameters())):
        bucket.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
        if size >= bucket_bytes:
            reduce_bucket(bucket)
            bucket, size = [], 0
    if bucket:
        reduce_bucket(bucket)


def reduce_bucket(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def main():
    a = parse()
    torch.manual_seed(0)
    store = os.path.join(tempfile.mkdtemp(), "store")  # FileStore wants a path that does not exist yet
    dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)
    torch.cuda.set_device(0)
    model = Model(a).to(device="cuda", dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device="cuda")
    schedule = torch.profiler.schedule(wait=1, warmup=2, active=4, repeat=1)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=True,
                                on_trace_ready=lambda p: p.export_chrome_trace(a.out)) as profiler:
        for _ in range(7):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, a.vocab), tokens[:, 1:].reshape(-1))
            loss.backward()
            all_reduce_gradients(model, a.bucket_mib << 20)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            profiler.step()
    torch.cuda.synchronize()
    print(f"{a.out}: loss {loss.item():.4f}, {sum(p.numel() for p in model.parameters())} parameters, "
          f"{os.path.getsize(a.out)} bytes", file=sys.stderr)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
