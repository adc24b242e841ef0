#pragma once
// Runs a step's TaskGraph with real tensors on the CPU, task by task, through the kernels' CPU references: the
// numerical half of the executor, built and tested everywhere. It gives the loss and every parameter's gradient,
// so a chunked, offloaded plan can be checked against a plain unchunked step (`trainyard run --check`), and it
// trains small models (the loss curve). The CUDA executor runs the same ops on the GPU.
//
// Every task must say what it is (sim::Op): builders annotate their tasks, and a graph with a task left at
// OpCode::none is refused, naming the task. The graph is the only source of the step's dataflow: each tensor
// lives where the graph put it (a GPU's HBM, its node's host DRAM) and moves only through the graph's copies
// and sends, and a free drops what its allocation held. While running, every read is checked:
//   - the tensor is at that place (else the plan lacks a copy),
//   - it is the latest value there (else the copy is stale: it ran before the last update),
//   - the task that put it there is an ancestor of the reader in the graph (else the order only held by
//     chance: a race on a real GPU),
// and every free must come after all the reads of what it frees. A violation throws InternalError naming the
// task and the tensor. Values produced outside any allocation (a visit's output on its way to the next stage)
// are not dropped by frees. Model states (weights, gradients, optimizer moments) are held once per step here,
// not per device: the graph's copies of them (streamed weights, host optimizer) are run for timing on the GPU
// and carry no values in this reference.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/communicator.hpp"
#include "backend/dataflow.hpp"
#include "backend/model_state.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::backend {

// One read or write of a tensor at a place, as the reference executor did it (ReferenceOptions::record).
struct RecordedAccess {
  sim::TaskId task = 0;
  sim::DeviceId place = 0;
  Key key;
  bool write = false;
};

struct ReferenceOptions {
  bool emulate_bf16 = true;    // round what is stored in bf16 (activations, weights) as the GPU does
  bool run_optimizer = false;  // apply AdamW at the graph's optimizer tasks (else gradients are left as they are)
  kernels::AdamW adam;
  int optimizer_step = 1;  // AdamW's step count t
  // The ancestor check costs tasks^2 / 8 bytes; above this many tasks it is skipped (and said in the result).
  std::int64_t race_check_max_tasks = 40000;
  // When set, every read and write is appended here (the test of backend/dataflow.hpp's table against the numerics).
  std::vector<RecordedAccess>* record = nullptr;
  // Several ranks (one per GPU of the graph: GPU g is rank g): this rank runs its GPU's tasks on its own copy of
  // the model states; a send to another rank's GPU is a message (backend/communicator.hpp), a gradient reduction
  // (sim::Op::gradients) sums the groups it carries over its members' ranks, and the loss is summed over all
  // ranks. Frees and host allocations run on every rank (each drops what it holds). A rank checks the dataflow
  // of what it holds; a received tensor keeps the version it was sent with. Null or one rank: everything here.
  Communicator* comm = nullptr;
};

struct ReferenceResult {
  double loss = 0;          // mean cross-entropy over the step's tokens
  std::int64_t tokens = 0;  // tokens the loss averaged over
  std::int64_t tasks_run = 0;
  std::int64_t reads_checked = 0;  // tensor reads that passed the residency, staleness and order checks
  bool race_checked = false;       // the ancestor check ran (see race_check_max_tasks)
};

// Runs the step of `graph` (finalized or not) on `state`: gradients are zeroed first and hold the step's sums
// (divided by the step's token count, as the loss is) afterwards. `tokens[s]` holds sequence s's token ids, the
// graph's TaskGraph::sequence_tokens of them, then the next-token target (another length is an InputError). The
// graph says its chunk length (TaskGraph::chunk_tokens); its GEMM and attention shapes are checked against it.
ReferenceResult run_reference_step(const sim::TaskGraph& graph, ModelState& state, int gpus_per_node,
                                   std::span<const std::vector<std::int32_t>> tokens, const ReferenceOptions& options = {});

// After a step on several ranks: every parameter group's gradients and weights, from the lowest rank whose GPU
// runs the group's forward, into rank 0's `state`, so that rank 0 holds what a single-rank run would. Every rank
// calls it.
void gather_to_rank0(const sim::TaskGraph& graph, ModelState& state, Communicator& comm);

}  // namespace trainyard::backend
