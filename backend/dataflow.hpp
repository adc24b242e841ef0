#pragma once
// The step's tensors in the model's terms: which tensor each task reads and writes, where it lives and for how
// long. Compute ops touch what the op table (ops.hpp) says; this file follows the tensors through the graph's
// copies, sends and frees. Shared by the two executors: the CPU reference (reference_step.hpp) holds the values,
// the CUDA executor (executor.hpp) needs to know every buffer before it submits anything, because it enqueues
// the whole step ahead of the GPU. Plain C++, built and tested everywhere: the test runs both descriptions of the
// same step (this plan and the reference's actual reads and writes) against each other.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/ops.hpp"
#include "models/model.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::backend {

// The order the CPU reference runs a graph in: among ready tasks the lowest id first, where a task waits for its
// dependencies and for the task before it on each stream it occupies (sim::for_each_occupied_stream: the
// simulator's rule; streams run in order, as CUDA's do). With `preds`, each
// task's predecessors in that sense. Throws InternalError on a cycle.
std::vector<sim::TaskId> stream_ordered_order(const sim::TaskGraph& graph, std::vector<std::vector<sim::TaskId>>* preds = nullptr);

// InputError unless the step's token ids are sequences of the graph's length (TaskGraph::sequence_tokens) and the
// graph says its chunk length: an executor runs a graph only on the sequences it was built for.
void check_sequence_length(const sim::TaskGraph& graph, std::int64_t sequence_tokens);

// The tensors a copy, send or allocation covers (empty for model states and for ops that are not moves).
std::vector<Key> content(const sim::Op& op);
// What `key` (of content(op)) becomes where a move of `op` delivers it: itself, except that a ring attention's
// dK|dV accumulator (OpCode::dkv_pass) arrives as the receiver's incoming accumulator (Role::dkv_in).
Key arrival(const sim::Op& op, Key key);

// One tensor at one place (a GPU's HBM or its node's host DRAM) from the write that created it to its release.
struct Instance {
  Key key;
  sim::DeviceId place = 0;
  ElementType dtype = ElementType::bf16;
  std::int64_t bytes = 0;
  std::vector<int> accessors;             // positions in the order that read or write it
  int release_after = -1;                 // position after which its bytes may be reused (see plan_dataflow)
  std::int64_t host_offset_bytes = -1;    // host instances: offset in the pinned arena (no reuse inside a step)
  std::int64_t device_offset_bytes = -1;  // device instances: offset in their GPU's arena
  std::vector<int> reuses;                // device instances: earlier instances whose bytes it takes (wait for their accessors)
};

// What one task touches: for compute ops one instance per compute_uses entry, in its order (an OpTensors finds
// them by name); for moves (source, destination) pairs of content(). Negative entries: an accumulator move whose
// source nothing has added to yet (skipped), or the other rank's side of a send between ranks.
struct TaskTensors {
  sim::TaskId task = 0;
  std::vector<int> instances;
  std::vector<Use> uses;        // compute ops: the op table's tensors (compute_uses), instances[i] holding uses[i]
  std::vector<int> zero_first;  // new buffers to zero before the task: accumulators, and the LM head's first dx piece
};

struct DataflowPlan {
  std::vector<Instance> instances;
  std::vector<TaskTensors> steps;          // per position in the order
  std::vector<std::vector<int>> releases;  // per position: instances released after it
  std::int64_t host_bytes = 0;             // the pinned arena: every host instance of the step, no reuse
  std::int64_t device_peak_bytes = 0;      // live device instances' high-water mark in this order (per GPU, max)
  std::int64_t device_arena_bytes = 0;     // the arena they are placed in (the peak plus alignment and fragmentation)
};

// Walks `order` (a topological order of the graph, such as the schedule's submission order) and gives every
// tensor instance its size, accessors and release: an instance that an allocation holds is released where the
// graph frees that allocation (so the executor holds memory as the simulator did); any other (a visit's
// intermediate) after its last access. Device instances are placed in one arena per GPU offline
// (place_lifetimes, 256-byte aligned); an instance reusing bytes waits for the accessors of their earlier owners. Throws InternalError when a read
// finds nothing (the reference executor says which copy is missing; run it first on a small model).
// With `rank` >= 0 the order is that rank's (one process per GPU): a send to another rank's GPU reads here and
// writes nothing here (its destination entries are -1), a send from another rank writes here what it carries
// (its source entries are -1), and an accumulator nothing has added to yet is created zeroed to be sent, so that
// both ranks agree on what the message holds.
DataflowPlan plan_dataflow(const sim::TaskGraph& graph, std::span<const sim::TaskId> order, const model::ModelConfig& model, int gpus_per_node,
                           int rank = -1);

}  // namespace trainyard::backend
