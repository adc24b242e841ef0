#!/usr/bin/env python3
"""A large synthetic Nsight Systems SQLite export for timing trainyard's reader (benchmarks/results/traces.md):
STEPS steps of 10,000 kernels (a GEMM and an elementwise kernel in turn, 10 us each), each launched by a runtime call
on one thread, and one ProfilerStep#N NVTX range per step. The tables are the fixture's (tests/data/traces/nsys/
nsys-current.sql). Usage: make_nsys_export.py STEPS OUT.sqlite   (300 steps: 3M kernels, about 270 MB)"""
import sqlite3, re, sys
import os
schema = open(os.path.join(os.path.dirname(__file__), '..', 'tests', 'data', 'traces', 'nsys', 'nsys-current.sql')).read()
creates = re.findall(r'CREATE TABLE[^;]*;', schema)
db = sqlite3.connect(sys.argv[2])
for c in creates: db.execute(c)
db.executemany('INSERT INTO StringIds VALUES (?,?)', [(1,'nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT'),(2,'void at::native::vectorized_elementwise_kernel<4>'),(3,'cudaLaunchKernel'),(4,'ProfilerStep')])
tid = (4242 << 24) | 4242
pid = (4242 << 24)
steps = int(sys.argv[1]); per_step = 10000
t = 0; corr = 0
for s in range(steps):
    step_start = t
    kern, rt = [], []
    for k in range(per_step):
        corr += 1
        rt.append((t, t + 2000, 1, tid, corr, 3, 0, None))
        kern.append((t + 3000, t + 13000, 0, 1, 7, corr, pid, 1 + (k % 2), 1 + (k % 2), None, 132, 1, 1, 256, 1, 1, 64))
        t += 12000
    db.executemany('INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)', rt)
    db.executemany('INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)', kern)
    db.execute('INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?,?,?,?,?)', (step_start, t, 59, f'ProfilerStep#{s}', tid))
db.commit()
