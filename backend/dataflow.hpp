#pragma once
// The step's tensors in the model's terms: which tensor each task reads and writes, where it lives and for how
// long. Shared by the two executors: the CPU reference (reference_step.hpp) holds the values, the CUDA executor
// (executor.hpp) needs to know every buffer before it submits anything, because it enqueues the whole step
// ahead of the GPU. Plain C++, built and tested everywhere: the test runs both descriptions of the same step
// (this table and the reference's actual reads and writes) against each other.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::backend {

// The tensors of one (layer, chunk), by role. Forward: x (the layer's input), n1, q, k, v (after RoPE), o_run and
// lse (the running attention state), o, p (projection), h1, n2, gu (gate | up), a, mo (MLP output), then the next
// layer's x. Backward: dx is the gradient of x (OpCode::input_grad), dkv the fp32 dK | dV of a chunk.
enum class Role : std::uint8_t {
  x, n1, q, k, v, o_run, o, lse, p, h1, n2, gu, a, mo,
  dm, dh1, da, dgu, dn2, dp, d_o, delta, dq, dkv, dqkv, dn1, dx,
  nf, logits, dlogits,  // the LM head's pieces (sub = the piece's first token)
};

struct Key {
  Role role;
  std::int32_t seq, layer, chunk, sub = 0;
  auto operator<=>(const Key&) const = default;
};

std::string describe(const Key& k);  // "Q of layer 3 chunk 1 (sequence 0)"

// The order the CPU reference runs a graph in: among ready tasks the lowest id first, where a task waits for its
// dependencies and for the task before it on its stream (streams run in order, as CUDA's do). With `preds`, each
// task's predecessors in that sense. Throws InternalError on a cycle.
std::vector<sim::TaskId> stream_ordered_order(const sim::TaskGraph& graph, std::vector<std::vector<sim::TaskId>>* preds = nullptr);

// The tensors a copy, send or allocation covers (empty for model states and for ops that are not moves).
std::vector<Key> content(const sim::Op& op);

enum class DType : std::uint8_t { bf16, fp32 };
constexpr std::int64_t dtype_bytes(DType t) { return t == DType::bf16 ? 2 : 4; }

// read: must exist. write: a new value (an existing buffer at that place is overwritten). update: read and then
// written in place. accumulate: added to in place, starting from zero where nothing has added yet.
enum class Access : std::uint8_t { read, write, update, accumulate };

struct Use {
  Key key;
  Access access = Access::read;
  std::int64_t elements = 0;  // for writes and accumulates: the size in the CUDA executor's layout
  DType dtype = DType::bf16;
};

// The tensors a compute op (not a move, not the optimizer) reads and writes, in the CUDA executor's layouts:
// activations and their gradients bf16 [rows][width]; the running attention output, lse, delta, dQ and the dK|dV
// accumulators fp32; gate|up and dgate|dup as two [rows][ffn] halves; dQKV as dQ, dK, dV blocks one after another.
// Throws InternalError for ops that are not compute ops.
std::vector<Use> compute_uses(const sim::Op& op, const model::ModelConfig& model, std::int64_t chunk_tokens);

// One tensor at one place (a GPU's HBM or its node's host DRAM) from the write that created it to its release.
struct Instance {
  Key key;
  sim::DeviceId place = 0;
  DType dtype = DType::bf16;
  std::int64_t bytes = 0;
  std::vector<int> accessors;      // positions in the order that read or write it
  int release_after = -1;          // position after which its bytes may be reused (see plan_dataflow)
  std::int64_t host_offset_bytes = -1;  // host instances: offset in the pinned arena (no reuse inside a step)
  std::int64_t device_offset_bytes = -1;  // device instances: offset in their GPU's arena
  std::vector<int> reuses;              // device instances: earlier instances whose bytes it takes (wait for their accessors)
};

// What one task touches, in the order of compute_uses (compute ops) or as (source, destination) pairs of
// content() (moves). Negative entries: an accumulator move whose source nothing has added to yet (skipped).
struct TaskTensors {
  sim::TaskId task = 0;
  std::vector<int> instances;
  std::vector<int> zero_first;  // new buffers to zero before the task: accumulators, and the LM head's first dx piece
};

struct DataflowPlan {
  std::vector<Instance> instances;
  std::vector<TaskTensors> steps;             // per position in the order
  std::vector<std::vector<int>> releases;     // per position: instances released after it
  std::int64_t host_bytes = 0;                // the pinned arena: every host instance of the step, no reuse
  std::int64_t device_peak_bytes = 0;         // live device instances' high-water mark in this order (per GPU, max)
  std::int64_t device_arena_bytes = 0;        // the arena they are placed in (the peak plus alignment and fragmentation)
};

// Walks `order` (a topological order of the graph, such as the schedule's submission order) and gives every
// tensor instance its size, accessors and release: an instance that an allocation holds is released where the
// graph frees that allocation (so the executor holds memory as the simulator did); any other (a visit's
// intermediate) after its last access. Device instances are placed in one arena per GPU offline
// (place_lifetimes, 256-byte aligned); an instance reusing bytes waits for the accessors of their earlier owners. Throws InternalError when a read finds nothing (the reference executor
// says which copy is missing; run it first on a small model).
DataflowPlan plan_dataflow(const sim::TaskGraph& graph, std::span<const sim::TaskId> order, const model::ModelConfig& model,
                           std::int64_t chunk_tokens, int gpus_per_node);

}  // namespace trainyard::backend
