#!/usr/bin/env python3
"""Fits the built-in length distributions of planner/lengths.cpp (dist:commoncrawl, dist:github) to HotSPa's
Table 3 as its artifact ran it (docs/hotspa_notes.md, "Lengths").

A mini-batch is 512 documents, each cut at 32K + 1 tokens. Under the static plan (DP 1, TP 16, PP 2) the documents
are packed first-fit decreasing into one bucket of 32K rows, every row padded to 32K: every row costs the same, so
the published static seconds give the number of rows a dataset's 512 documents fill:

    rows = (static_s - fixed_s) / row_s

with row_s and fixed_s from trainyard's own simulation of the static plan on N full rows (t(N) = fixed_s + N row_s,
fitted through two N). Each dataset's lognormal(mu, sigma) over document tokens is then fitted so that the mean row
count of 512 draws (first-fit decreasing, as the artifact packs) is that number; along that curve, sigma is the one
whose token shares per length group best match (squared log error) the static column's time shares, the earlier
fit's constraint. Those shares cannot all be met with 512 documents (see the printout); the row count is met.

Usage: scripts/fit_length_dists.py [path/to/trainyard] [--row-cost ROW_S,FIXED_S]   (default build/trainyard; the
row cost given skips its simulation). Pure Python; prints the fit.
"""
import json
import math
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = sys.argv[1:]
ROW_COST = ARGS[ARGS.index("--row-cost") + 1] if "--row-cost" in ARGS else None
PATHS = [a for i, a in enumerate(ARGS) if not a.startswith("--") and (i == 0 or ARGS[i - 1] != "--row-cost")]
BIN = PATHS[0] if PATHS else os.path.join(ROOT, "build", "trainyard")

K = 1024
MAX_LEN = 32 * K            # the artifact's --seq 32768
LABEL_SHIFT = 1             # planner::kLabelShiftTokens: a document is cut at MAX_LEN + 1 tokens
MIN_DOC_TOKENS = 16         # planner::kMinDocumentTokens: shorter draws are redrawn
DOCUMENTS = 512             # GLOBAL_BATCH_SIZE of hotspa/scripts/exprs_for_paper
EDGES = [0, 1 * K, 4 * K, 8 * K, 16 * K, 32 * K]
STATIC = "megatron:dp=1,tp=16,pp=2,sequence_parallel=true"
SETTING = ["--model", "hotspa-32b", "--hw", "hgx-a800", "--nodes", "4", "--max-len", "32K", "--batching", "ffd-padded"]
# Seed 004, Table 3: static seconds per group (0~1K ... 16K~32K) and the static total.
PUBLISHED = {
    "commoncrawl": {"groups": [42.1, 12.5, 3.5, 2.9, 2.4], "static_s": 63.4},
    "github": {"groups": [34.9, 38.4, 25.0, 27.3, 53.0], "static_s": 178.6},
}
BATCHES = 64                # draws averaged per evaluation (common random numbers across mu and sigma)
SIGMAS = [0.4 + 0.1 * i for i in range(27)]


def static_seconds(rows):
    """trainyard's static plan on `rows` full 32K rows (every document 32K + 1 tokens: one row each)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(f"{MAX_LEN + LABEL_SHIFT}\n")
        path = f.name
    try:
        r = subprocess.run([BIN, "simulate", "--lengths", path, "--batch-sequences", str(rows), "--static", STATIC, "--json"] + SETTING,
                           capture_output=True, text=True)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        sys.exit(f"trainyard failed: {r.stderr}")
    return json.loads(r.stdout)["static"]["total_s"]


def row_cost():
    """(row_s, fixed_s) of the static plan, and the largest departure from that line at a third point."""
    n1, n2, n3 = 32, 128, 80
    t1, t2, t3 = static_seconds(n1), static_seconds(n2), static_seconds(n3)
    row_s = (t2 - t1) / (n2 - n1)
    fixed_s = t1 - n1 * row_s
    return row_s, fixed_s, t3 - (fixed_s + n3 * row_s)


def normals(seed):
    """Standard normals for one mini-batch: enough for the documents and the redraws of short ones."""
    g = random.Random(seed)
    return [g.gauss(0.0, 1.0) for _ in range(16 * DOCUMENTS)]


STREAMS = [normals(1000 + b) for b in range(BATCHES)]


def documents(mu, sigma, z):
    """Trained positions of one mini-batch (planner::sample_documents with these normals)."""
    out = []
    for x in z:
        tokens = math.floor(math.exp(mu + sigma * x) + 0.5)
        if tokens < MIN_DOC_TOKENS:
            continue
        out.append(min(tokens, MAX_LEN + LABEL_SHIFT) - LABEL_SHIFT)
        if len(out) == DOCUMENTS:
            return out
    sys.exit("too many short documents: widen the normal stream")


def ffd_rows(positions):
    """First-fit decreasing into rows of MAX_LEN + 1 tokens, each document its positions + 1 (planner::first_fit_decreasing)."""
    rooms = []
    for p in sorted(positions, reverse=True):
        need = p + LABEL_SHIFT
        for i, room in enumerate(rooms):
            if room >= need:
                rooms[i] -= need
                break
        else:
            rooms.append(MAX_LEN + LABEL_SHIFT - need)
    return len(rooms)


def evaluate(mu, sigma):
    """Mean rows over the batches and the token shares per group (positions, all batches pooled)."""
    rows, per_group = 0, [0] * 5
    for z in STREAMS:
        docs = documents(mu, sigma, z)
        rows += ffd_rows(docs)
        for p in docs:
            per_group[next(i for i in range(5) if p <= EDGES[i + 1])] += p
    total = sum(per_group)
    return rows / BATCHES, [g / total for g in per_group]


MU_RANGE = (3.0, 12.0)      # ln(tokens): medians of 20 to 160K tokens


def mu_for_rows(sigma, target):
    lo, hi = MU_RANGE
    for _ in range(40):
        mid = (lo + hi) / 2
        if evaluate(mid, sigma)[0] < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 0.005:
            break
    return (lo + hi) / 2


def share_error(shares, target):
    return sum((math.log(a + 1e-9) - math.log(b)) ** 2 for a, b in zip(shares, target))


def main():
    if ROW_COST:
        row_s, fixed_s = (float(x) for x in ROW_COST.split(","))
        print(f"static plan ({STATIC}) on N full 32K rows, as given: {fixed_s:.3f} s + N x {row_s:.4f} s")
    else:
        row_s, fixed_s, departure = row_cost()
        print(f"static plan ({STATIC}) on N full 32K rows: {fixed_s:.3f} s + N x {row_s:.4f} s "
              f"(a third point departs from the line by {departure:+.3f} s)")
    sys.stdout.flush()
    for name, pub in PUBLISHED.items():
        target_rows = (pub["static_s"] - fixed_s) / row_s
        target_shares = [g / sum(pub["groups"]) for g in pub["groups"]]
        best = None
        for sigma in SIGMAS:
            mu = mu_for_rows(sigma, target_rows)
            rows, shares = evaluate(mu, sigma)
            err = share_error(shares, target_shares)
            if best is None or err < best[0]:
                best = (err, mu, sigma, rows, shares)
        err, mu, sigma, rows, shares = best
        print(f"{name}: static {pub['static_s']} s -> {target_rows:.1f} rows; lognormal mu={mu:.2f} sigma={sigma:.2f} "
              f"gives {rows:.1f} rows on average over {BATCHES} mini-batches (share error {err:.3f})")
        print("  static time shares  ", [round(x, 3) for x in target_shares])
        print("  fitted token shares ", [round(x, 3) for x in shares])
        sys.stdout.flush()


main()
