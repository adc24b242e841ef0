#pragma once
// The CUDA executor: runs a step's TaskGraph on a GPU with the real kernels, the same tasks the
// simulator timed. It walks the rank's schedule (schedule.hpp: streams, submission order, event waits) and
// enqueues the whole step ahead of the GPU: GEMMs through cuBLASLt (kernels::Gemm, one per stream), attention,
// norms, activations, loss and AdamW through kernels/, copies with cudaMemcpyAsync between the tensors' HBM arena
// and pinned host memory on the schedule's H2D/D2H streams, and a CUDA event pair around every task.
//
// Which tensor each task reads and writes, how big it is and when its bytes are free again come from the op table
// (ops.hpp) and the dataflow plan (dataflow.hpp), which the tests hold to the CPU reference executor: the GPU runs
// the same ops on the same tensors as reference_step.hpp, in bf16 storage with fp32 accumulators, and finds each
// by name (OpTensors). Tensors live in one arena planned offline; a tensor that reuses bytes waits for the tasks
// that touched their earlier owner.
//
// NOT YET RUN ON A GPU: no GPU was lent while this was written. It compiles, and the parts below the GPU calls are
// tested on the CPU (the dataflow table, the arenas, the schedule); tests/test_gpu_executor.cpp compares a step
// with the CPU reference and skips without a GPU.
//
// What it refuses (InputError, before anything runs): several GPUs (NCCL sends and collectives are not written
// yet), tasks on the host (a CPU optimizer) and moves of model states (streamed weights, offloaded optimizer
// states): the weights, gradients, master weights and moments stay resident in HBM.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/model_state.hpp"
#include "kernels/reference.hpp"
#include "sim/engine.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::backend {

struct ExecutorOptions {
  bool run_optimizer = false;  // AdamW at the graph's optimizer tasks (else the gradients are left as they are)
  kernels::AdamW adam;
};

struct MeasuredStep {
  double loss = 0;  // mean cross-entropy over the step's tokens
  std::int64_t tokens = 0;
  std::int64_t step_ns = 0;             // the first task's start to the last task's end (CUDA events)
  std::vector<sim::TaskTiming> timing;  // per task id, from the step's start; -1 for allocations and frees
  std::int64_t arena_bytes = 0;         // the tensors' arena
  std::int64_t live_peak_bytes = 0;     // the tensors' live high-water mark in submission order (arena minus fragmentation)
  std::int64_t states_bytes = 0;        // model states, token ids, losses and the GEMM workspaces
  std::int64_t scratch_peak_bytes = 0;  // the stream-ordered pool's high-water mark (per-task scratch: attention partials)
  std::int64_t pinned_bytes = 0;        // host tensors (pinned)
  std::int64_t device_used_bytes = 0;   // cudaMemGetInfo: total - free at the end of the step
  std::int64_t peak_hbm_bytes() const { return arena_bytes + states_bytes + scratch_peak_bytes; }
};

class GpuExecutor {
 public:
  // Plans the schedule (submission order following `predicted`, the simulator's timings, where given), the
  // tensors and both arenas, then allocates on the current device; `shapes` gives the parameters' shapes and
  // groups (its values are not read: upload() does that). Throws InputError for what it does not run (above) and
  // when the arena and the states do not fit the device's free memory, with the numbers.
  GpuExecutor(const sim::TaskGraph& graph, ModelState& shapes, int gpus_per_node, std::span<const sim::TaskTiming> predicted,
              const ExecutorOptions& options);
  ~GpuExecutor();
  GpuExecutor(const GpuExecutor&) = delete;
  GpuExecutor& operator=(const GpuExecutor&) = delete;

  void upload(const ModelState& state);    // weights, master weights and moments
  void download(ModelState& state) const;  // gradients, weights, master weights and moments

  // One step on `tokens` (seq_len + 1 ids per sequence); waits for the GPU. `optimizer_step` is AdamW's t.
  MeasuredStep run_step(std::span<const std::vector<std::int32_t>> tokens, int optimizer_step = 1);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::backend
