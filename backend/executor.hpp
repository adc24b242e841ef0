#pragma once
// The executor: runs a step's TaskGraph on a device (device.hpp) with the real kernels, the same tasks the
// simulator timed. It walks the rank's schedule (schedule.hpp: streams, submission order, event waits) and
// enqueues the whole step ahead of the device: GEMMs, attention, norms, activations, loss and AdamW through the
// device's kernels, copies between the tensors' arena and pinned host memory on the schedule's H2D/D2H streams,
// and an event pair around every task. The same code drives both devices:
//   - the CUDA device (make_cuda_device): cuBLASLt and kernels/ on a GPU; run on one H100 (benchmarks/results/gpu.md);
//   - the CPU device (cpu_device.hpp): streams as threads, events as real synchronisation, the CPU references as
//     kernels. It runs the schedule concurrently, so a wait the schedule lacks is a data race ThreadSanitizer sees,
//     and it is how everything here is tested without a GPU.
//
// Which tensor each task reads and writes, how big it is and when its bytes are free again come from the op table
// (ops.hpp) and the dataflow plan (dataflow.hpp), which the tests hold to the CPU reference executor: the device
// runs the same ops on the same tensors as reference_step.hpp, in bf16 storage with fp32 accumulators, and finds
// each by name (OpTensors). Tensors live in one arena planned offline; a tensor that reuses bytes waits for the
// tasks that touched their earlier owner.
//
// Several ranks (ExecutorOptions::comm, one per GPU): each runs its GPU's share of the schedule; gradient
// reductions are the device's all-reduces and sends between GPUs the device's send/recv over the communicator (MPI
// on the CPU device; NCCL on the CUDA device, written but not yet run). A group reduced again over the same ranks
// (ZeRO-2/3, every micro-batch) sums only the shares added since its last reduction.
// What it refuses (InputError, before anything runs; executor_refusal): on one rank, several GPUs; under mpirun,
// other than one rank per GPU; collectives on activations other than those it runs (Ulysses' all-to-alls, tensor
// parallelism's sums and gathers, all-gather context parallelism's exchanges); host tasks other than the optimizer
// step and the sums of streamed gradients; copies of model states that do not say which; offloaded gradients or
// streamed weights without an optimizer step on the host; tensor parallelism over other than consecutive GPUs; a
// parameter group used on GPUs that no reduction joins.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/device.hpp"
#include "backend/model_state.hpp"
#include "kernels/reference.hpp"
#include "sim/engine.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::backend {

struct ExecutorOptions {
  bool run_optimizer = false;  // AdamW at the graph's optimizer tasks (else the gradients are left as they are)
  kernels::AdamW adam;
  // Several ranks, one per GPU of the graph (GPU g is rank g): this rank runs its GPU's share of the schedule, and
  // the graph's gradient reductions (sim::Op::gradients) sum the groups they carry over their members' ranks,
  // queued on their streams like any other work, and sends between GPUs go from the sender's stream to a receive
  // stream of the receiver. Null or one rank: the whole graph here.
  Communicator* comm = nullptr;
  std::chrono::milliseconds comm_timeout{300000};  // the longest a device's collective may take (CUDA: NCCL)
};

struct MeasuredStep {
  double loss = 0;  // mean cross-entropy over the step's tokens
  std::int64_t tokens = 0;
  std::int64_t step_ns = 0;             // the first task's start to the last task's end (the device's events)
  std::vector<sim::TaskTiming> timing;  // per task id, from the step's start; -1 for allocations and frees (and other ranks' tasks)
  std::int64_t first_task_ns = 0;       // the step's start after its origin event (several ranks: the origins follow one barrier)
  std::int64_t arena_bytes = 0;         // the tensors' arena
  std::int64_t live_peak_bytes = 0;     // the tensors' live high-water mark in submission order (arena minus fragmentation)
  std::int64_t states_bytes = 0;        // model states, token ids, losses and the GEMM workspaces
  std::int64_t scratch_peak_bytes = 0;  // per-task scratch's high-water mark (attention partials)
  std::int64_t pinned_bytes = 0;        // host tensors (pinned)
  std::int64_t device_used_bytes = 0;   // the device's memory in use at the end of the step (Device::used_bytes)
  std::int64_t peak_hbm_bytes() const { return arena_bytes + states_bytes + scratch_peak_bytes; }
};

// Why the executor cannot run a graph on `ranks` ranks, whatever the device (InputError's parts), or nothing when
// it can.
struct ExecutorRefusal {
  std::string task;      // "task 12 'F L0 c1 kv h2d'"
  std::string expected;  // what the executor runs
  std::string found;
};
std::optional<ExecutorRefusal> executor_refusal(const sim::TaskGraph& graph, int ranks = 1);

class Executor {
 public:
  // Plans the schedule (submission order following `predicted`, the simulator's timings, where given), the
  // tensors and both arenas, then allocates on `device` (which must outlive the executor); `shapes` gives the parameters' shapes and
  // groups (its values are not read: upload() does that). Throws InputError for what it does not run (above) and
  // when the arena and the states do not fit the device's free memory, with the numbers.
  Executor(Device& device, const sim::TaskGraph& graph, ModelState& shapes, int gpus_per_node, std::span<const sim::TaskTiming> predicted,
           const ExecutorOptions& options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void upload(const ModelState& state);    // weights, master weights and moments
  void download(ModelState& state) const;  // gradients, weights, master weights and moments

  // One step on `tokens` (per sequence the graph's TaskGraph::sequence_tokens + 1 ids; another length is an
  // InputError); waits for the device. `optimizer_step` is AdamW's t.
  MeasuredStep run_step(std::span<const std::vector<std::int32_t>> tokens, int optimizer_step = 1);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::backend
