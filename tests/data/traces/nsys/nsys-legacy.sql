-- A hand-made Nsight Systems SQLite export in an older schema (nsys 2020-2021): no META_DATA_EXPORT, no ENUM_* tables,
-- no CUPTI_ACTIVITY_KIND_MEMSET (nothing was memset, so Nsight Systems made no table), NVTX_EVENTS with the text
-- inline only (no textId, no jsonText: NCCL's payloads are not rendered, so collectives' sizes are unknown).
-- One process, pid 777, on GPU 1: globalPid 777 << 24, main thread's globalTid (777 << 24) + 777.

CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT NOT NULL, end INT NOT NULL, eventClass INT NOT NULL, globalTid INT,
  correlationId INT, nameId INT NOT NULL, returnValue INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL, contextId INT NOT NULL,
  streamId INT NOT NULL, correlationId INT, globalPid INT, demangledName INT NOT NULL, shortName INT NOT NULL,
  gridX INT NOT NULL, gridY INT NOT NULL, gridZ INT NOT NULL, blockX INT NOT NULL, blockY INT NOT NULL, blockZ INT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL, contextId INT NOT NULL,
  streamId INT NOT NULL, correlationId INT, globalPid INT, bytes INT NOT NULL, copyKind INT NOT NULL, srcKind INT, dstKind INT);
CREATE TABLE NVTX_EVENTS (start INT NOT NULL, end INT, eventType INT NOT NULL, rangeId INT, category INT, color INT,
  text TEXT, globalTid INT, endGlobalTid INT, domainId INT);

INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel'), (2, 'cudaMemcpyAsync'),
  (3, 'sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas'),
  (4, 'sm90_xmma_gemm'),
  (5, 'ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclWorkElem)'), (6, 'ncclKernel_AllReduce_RING_LL_Sum_bf16');

-- Two steps of 2 ms (ProfilerStep#0 and #1, PyTorch's record_function ranges under emit_nvtx); per step PyTorch's
-- "nccl:all_reduce" range (no payload) around the NCCL launch.
INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES
  (10000000, 12000000, 59, 'ProfilerStep#0', 777 * 16777216 + 777, 0),
  (12000000, 14000000, 59, 'ProfilerStep#1', 777 * 16777216 + 777, 0),
  (10100000, 10200000, 59, 'nccl:all_reduce', 777 * 16777216 + 777, 0),
  (12100000, 12200000, 59, 'nccl:all_reduce', 777 * 16777216 + 777, 0);

-- Per step from H = 10 ms and 12 ms: +10 us an H2D copy, +50 us a GEMM, +150 us the NCCL all-reduce.
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES
  (10010000, 10015000, 1, 777 * 16777216 + 777, 1, 2, 0), (10050000, 10054000, 1, 777 * 16777216 + 777, 2, 1, 0),
  (10150000, 10154000, 1, 777 * 16777216 + 777, 3, 1, 0),
  (12010000, 12015000, 1, 777 * 16777216 + 777, 4, 2, 0), (12050000, 12054000, 1, 777 * 16777216 + 777, 5, 1, 0),
  (12150000, 12154000, 1, 777 * 16777216 + 777, 6, 1, 0);

-- On GPU 1: per step a 256 KiB H2D copy +100..120 us, a GEMM +200..500 us (stream 13), the all-reduce +500..1000 us
-- (stream 14).
INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES
  (10100000, 10120000, 1, 1, 13, 1, 777 * 16777216, 262144, 1, 0, 1),
  (12100000, 12120000, 1, 1, 13, 4, 777 * 16777216, 262144, 1, 0, 1);
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
  (10200000, 10500000, 1, 1, 13, 2, 777 * 16777216, 3, 4, 132, 1, 1, 384, 1, 1),
  (10500000, 11000000, 1, 1, 14, 3, 777 * 16777216, 5, 6, 16, 1, 1, 256, 1, 1),
  (12200000, 12500000, 1, 1, 13, 5, 777 * 16777216, 3, 4, 132, 1, 1, 384, 1, 1),
  (12500000, 13000000, 1, 1, 14, 6, 777 * 16777216, 5, 6, 16, 1, 1, 256, 1, 1);
