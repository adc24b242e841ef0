-- A hand-made Nsight Systems SQLite export in the current schema (nsys 2024-2025: META_DATA_EXPORT, ENUM_* tables,
-- StringIds, demangledName, NVTX text or textId, jsonText payloads). No GPU ran this: values are chosen to be
-- consistent (tests/data/traces/README.md). Only the columns trainyard reads and a few neighbours are declared.
-- Times are ns on the session's clock. One process, pid 4242: its globalPid is 4242 << 24; its main thread's
-- globalTid is (4242 << 24) + 4242, its autograd thread's (4242 << 24) + 4250.

CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
  globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, gridX INTEGER, gridY INTEGER,
  gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER, registersPerThread INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  value INTEGER NOT NULL, bytes INTEGER NOT NULL, memKind INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
  domainId INTEGER, jsonTextId INTEGER, jsonText TEXT);

INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.20.1'), ('EXPORT_PRODUCT_VERSION', '2025.3.1');
INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (0, 'CUDA_MEMCPY_OPER_UNKNOWN', 'Unknown'), (1, 'CUDA_MEMCPY_OPER_HTOD', 'Host-to-Device'),
  (2, 'CUDA_MEMCPY_OPER_DTOH', 'Device-to-Host'), (3, 'CUDA_MEMCPY_OPER_HTOA', 'Host-to-Array'),
  (4, 'CUDA_MEMCPY_OPER_ATOH', 'Array-to-Host'), (5, 'CUDA_MEMCPY_OPER_ATOA', 'Array-to-Array'),
  (6, 'CUDA_MEMCPY_OPER_ATOD', 'Array-to-Device'), (7, 'CUDA_MEMCPY_OPER_DTOA', 'Device-to-Array'),
  (8, 'CUDA_MEMCPY_OPER_DTOD', 'Device-to-Device'), (9, 'CUDA_MEMCPY_OPER_HTOH', 'Host-to-Host'),
  (10, 'CUDA_MEMCPY_OPER_PTOP', 'Peer-to-Peer');
INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (34, 'NvtxMark', 'NVTX Mark'), (59, 'NvtxPushPopRange', 'NVTX PushPop Range'),
  (60, 'NvtxStartEndRange', 'NVTX StartEnd Range');

INSERT INTO StringIds VALUES
  (1, 'cudaLaunchKernel'), (2, 'cudaMemcpyAsync'), (3, 'cudaMemsetAsync'), (15, 'cudaStreamSynchronize'),
  (4, 'nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT'),
  (5, 'void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>(flash::Flash_fwd_params)'),
  (6, 'flash_fwd_kernel'),
  (7, 'void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>>(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)'),
  (8, 'vectorized_elementwise_kernel'),
  (9, 'my_custom_kernel'),
  (10, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)'),
  (11, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL'),
  (12, 'ProfilerStep#4'),
  (13, 'ncclAllReduce'),
  (14, '{"NCCL communicator ID": 5924217398812, "Message size [bytes]": 16777216, "Reduction operation": "Sum"}');

-- NVTX: two ProfilerStep ranges on the main thread (#3 by text, #4 by textId), 1 ms each; a mark with a step's name
-- (no end: not a range, not a step); a "forward" range (not kept); NCCL's own init range (kept out: not a
-- collective); per step an "ncclAllReduce" range around the NCCL launch with its payload as JSON (step #3: text and
-- jsonText inline, with PyTorch's "nccl:all_reduce" around it; step #4: textId and jsonTextId).
INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId, jsonTextId, jsonText) VALUES
  (2000000, 3000000, 59, 'ProfilerStep#3', 4242 * 16777216 + 4242, NULL, 0, NULL, NULL),
  (3000000, 4000000, 59, NULL, 4242 * 16777216 + 4242, 12, 0, NULL, NULL),
  (4500000, NULL, 34, 'ProfilerStep#99', 4242 * 16777216 + 4242, NULL, 0, NULL, NULL),
  (2001000, 2090000, 59, 'forward', 4242 * 16777216 + 4242, NULL, 0, NULL, NULL),
  (500000, 900000, 59, 'ncclCommInitRank', 4242 * 16777216 + 4242, NULL, 7, NULL, NULL),
  (2055000, 2075000, 59, 'nccl:all_reduce', 4242 * 16777216 + 4242, NULL, 0, NULL, NULL),
  (2060000, 2070000, 59, 'ncclAllReduce', 4242 * 16777216 + 4242, NULL, 7, NULL,
   '{"NCCL communicator ID": 5924217398812, "Message size [bytes]": 16777216, "Reduction operation": "Sum"}'),
  (3060000, 3070000, 59, NULL, 4242 * 16777216 + 4242, 13, 7, 14, NULL);

-- The CUDA runtime calls (correlationId links each to its GPU work): per step at H = 2.0 ms and 3.0 ms, from H:
-- +10 us H2D copy, +20 us GEMM, +30 us flash attention, +40 us elementwise (from the autograd thread), +50 us custom
-- kernel, +62 us NCCL all-reduce (inside the ncclAllReduce range), +80 us D2H copy, +90 us DtoD copy, +95 us memset;
-- step #4 also +97 us a peer copy. Before the steps: a copy to a CUDA array (warm-up) and a synchronize.
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, returnValue) VALUES
  (1400000, 1405000, 1, 4242 * 16777216 + 4242, 11, 2, 0),
  (1900000, 1950000, 1, 4242 * 16777216 + 4242, 12, 15, 0),
  (2010000, 2015000, 1, 4242 * 16777216 + 4242, 101, 2, 0),
  (2020000, 2024000, 1, 4242 * 16777216 + 4242, 102, 1, 0),
  (2030000, 2034000, 1, 4242 * 16777216 + 4242, 103, 1, 0),
  (2040000, 2044000, 1, 4242 * 16777216 + 4250, 104, 1, 0),
  (2050000, 2054000, 1, 4242 * 16777216 + 4242, 105, 1, 0),
  (2062000, 2066000, 1, 4242 * 16777216 + 4242, 106, 1, 0),
  (2080000, 2085000, 1, 4242 * 16777216 + 4242, 107, 2, 0),
  (2090000, 2094000, 1, 4242 * 16777216 + 4242, 108, 2, 0),
  (2095000, 2096000, 1, 4242 * 16777216 + 4242, 109, 3, 0),
  (3010000, 3015000, 1, 4242 * 16777216 + 4242, 201, 2, 0),
  (3020000, 3024000, 1, 4242 * 16777216 + 4242, 202, 1, 0),
  (3030000, 3034000, 1, 4242 * 16777216 + 4242, 203, 1, 0),
  (3040000, 3044000, 1, 4242 * 16777216 + 4250, 204, 1, 0),
  (3050000, 3054000, 1, 4242 * 16777216 + 4242, 205, 1, 0),
  (3062000, 3066000, 1, 4242 * 16777216 + 4242, 206, 1, 0),
  (3080000, 3085000, 1, 4242 * 16777216 + 4242, 207, 2, 0),
  (3090000, 3094000, 1, 4242 * 16777216 + 4242, 208, 2, 0),
  (3095000, 3096000, 1, 4242 * 16777216 + 4242, 209, 3, 0),
  (3097000, 3098000, 1, 4242 * 16777216 + 4242, 210, 2, 0);

-- Kernels on GPU 0, per step from H: GEMM +150..250 us, flash attention forward +250..400 us, elementwise add
-- +400..410 us, my_custom_kernel +410..415 us (stream 7), the NCCL all-reduce +800..1200 us on stream 20: the GPU
-- runs behind the host, so each step's all-reduce ends after its host step.
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, globalPid, demangledName, shortName) VALUES
  (2150000, 2250000, 0, 1, 7, 102, 4242 * 16777216, 4, 4),
  (2250000, 2400000, 0, 1, 7, 103, 4242 * 16777216, 5, 6),
  (2400000, 2410000, 0, 1, 7, 104, 4242 * 16777216, 7, 8),
  (2410000, 2415000, 0, 1, 7, 105, 4242 * 16777216, 9, 9),
  (2800000, 3200000, 0, 1, 20, 106, 4242 * 16777216, 10, 11),
  (3150000, 3250000, 0, 1, 7, 202, 4242 * 16777216, 4, 4),
  (3250000, 3400000, 0, 1, 7, 203, 4242 * 16777216, 5, 6),
  (3400000, 3410000, 0, 1, 7, 204, 4242 * 16777216, 7, 8),
  (3410000, 3415000, 0, 1, 7, 205, 4242 * 16777216, 9, 9),
  (3800000, 4200000, 0, 1, 20, 206, 4242 * 16777216, 10, 11);

-- Copies, per step from H: H2D 1 MiB +100..140 us (stream 7), DtoD 2 MiB +420..440 us (stream 7), D2H 512 KiB
-- +1200..1220 us (stream 8, after the all-reduce); step #4 also a peer copy of 8 MiB +450..470 us (stream 30).
-- Before the steps: 64 KiB host to CUDA array (copyKind 3: "other").
INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, correlationId, globalPid, bytes, copyKind) VALUES
  (1500000, 1510000, 0, 1, 7, 11, 4242 * 16777216, 65536, 3),
  (2100000, 2140000, 0, 1, 7, 101, 4242 * 16777216, 1048576, 1),
  (2420000, 2440000, 0, 1, 7, 108, 4242 * 16777216, 2097152, 8),
  (3200000, 3220000, 0, 1, 8, 107, 4242 * 16777216, 524288, 2),
  (3100000, 3140000, 0, 1, 7, 201, 4242 * 16777216, 1048576, 1),
  (3420000, 3440000, 0, 1, 7, 208, 4242 * 16777216, 2097152, 8),
  (3450000, 3470000, 0, 1, 30, 210, 4242 * 16777216, 8388608, 10),
  (4200000, 4220000, 0, 1, 8, 207, 4242 * 16777216, 524288, 2);

-- A 4 KiB memset per step, +440..442 us (stream 7).
INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET (start, end, deviceId, contextId, streamId, correlationId, globalPid, value, bytes) VALUES
  (2440000, 2442000, 0, 1, 7, 109, 4242 * 16777216, 0, 4096),
  (3440000, 3442000, 0, 1, 7, 209, 4242 * 16777216, 0, 4096);
