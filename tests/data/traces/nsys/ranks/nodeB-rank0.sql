-- Rank 0 of a two-rank run, hand-made (tests/data/traces/README.md): a minimal export with kernels and NVTX steps
-- only (no runtime table: the GPU's steps are not projected, the kernels count in the host's step windows; no NCCL
-- range: the collective's metadata is unknown). Rank from the file name's trailing integer.
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, text TEXT, globalTid INTEGER,
  textId INTEGER);
INSERT INTO StringIds VALUES (1, 'nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT'),
  (2, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)');
-- Steps ProfilerStep#10 and #11, 0.5 ms each.
INSERT INTO NVTX_EVENTS VALUES (1000000, 1500000, 59, 'ProfilerStep#10', 5000 * 16777216 + 5000, NULL),
  (1500000, 2000000, 59, 'ProfilerStep#11', 5000 * 16777216 + 5000, NULL);
-- Per step on GPU 0: a GEMM of 100 us at +50 us (stream 7) and an all-reduce of 200 us at +200 us (stream 20).
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
  (1050000, 1150000, 0, 7, 1, 5000 * 16777216, 1, 1), (1200000, 1400000, 0, 20, 2, 5000 * 16777216, 2, 2),
  (1550000, 1650000, 0, 7, 3, 5000 * 16777216, 1, 1), (1700000, 1900000, 0, 20, 4, 5000 * 16777216, 2, 2);
