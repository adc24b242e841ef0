#pragma once
// From a TaskGraph to what one executor process submits: the plain C++ half of the backend, built and
// tested everywhere. The executor (executor.hpp) only walks this schedule, on either device.
//
// One process drives one GPU (its rank = its GPU index). Its schedule holds the tasks that involve that GPU:
// its own tasks, the receiving side of point-to-point sends to it, and the collectives it is a member of. Host
// tasks with a stream (CPU optimizer steps) go to the first rank of their node; host DRAM allocations and frees
// to every rank of the node (the order they carry must hold on each rank that copies).
//
// Ordering: each CUDA stream runs its tasks in task-id order, by the rule the simulator follows
// (sim::for_each_occupied_stream); dependencies on
// tasks of other streams become event waits, pruned to the latest task per stream (streams are in order).
// Allocations and frees take no stream: their waits pass through to the tasks that depend on them.
// Dependencies on tasks of other GPUs that are not communication tasks cannot be waited for locally; they
// hold through the sends and collectives between the two GPUs, and are counted.
//
// Memory: allocations get fixed offsets in one arena per pool (this GPU's HBM; pinned host memory), planned
// offline from their lifetimes in submission order (largest first, 256-byte aligned). When an allocation reuses bytes that a free released, the
// allocation waits for everything that free waited for, so the reuse is safe however the streams interleave.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "sim/engine.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::backend {

// A CUDA stream of this process. Receives get their own stream per comm index and sender, so a ring's send and
// receive never block each other, nor do receives from two peers whose order the graph does not fix (a
// pipeline's gradients from the next stage behind the cp ring's blocks that need them first).
struct StreamSlot {
  sim::DeviceId device = 0;  // this GPU, or its node's host for host tasks
  sim::Stream stream;
  bool receive = false;
  sim::DeviceId sender = -1;  // a receive slot's peer
  std::string name() const;   // "gpu0 compute0", "gpu1 comm0 recv from gpu0", "host0 host"
};

struct Submission {
  sim::TaskId task = 0;
  int slot = 0;                    // index into RankSchedule::streams (a receive slot: the receiving side of a send)
  std::vector<sim::TaskId> waits;  // tasks on other slots to wait for (their completion events)
};

struct Arena {
  std::int64_t size_bytes = 0;                       // the high-water mark of the plan
  std::map<sim::TaskId, std::int64_t> offset_bytes;  // per Alloc task
};

struct RankSchedule {
  int rank = 0;
  std::vector<StreamSlot> streams;
  std::vector<Submission> submissions;  // submission order: a topological order of dependencies and stream order
  std::vector<sim::TaskId> order;       // every task of this rank in that order, allocations and frees included
  std::vector<bool> waited_on;          // per task id: some step waits for it, so it records an event
  Arena hbm, pinned;
  int remote_dependencies = 0;  // dependencies on other GPUs' non-communication tasks (see above)
};

constexpr std::int64_t kArenaAlignment = 256;

// A buffer whose whole life is known in advance: live over [start, end) in some order of positions.
struct Lifetime {
  std::int64_t start = 0, end = 0;  // end = max when never released
  std::int64_t size = 0;
  std::int64_t offset = -1;  // set by place_lifetimes
};

// Offline placement of one arena's buffers: sets every offset and returns the arena's size. With `reuses`, gives
// per buffer the earlier buffers (ended at or before its start) whose bytes it overlaps: what it must wait for.
std::int64_t place_lifetimes(std::vector<Lifetime>& buffers, std::vector<std::vector<int>>* reuses = nullptr);

// Submission order follows `predicted` (the simulator's start times of a completed run) where given, task ids
// otherwise. Following the prediction matters: the arenas then hold what the simulator had live at each moment
// (their size is the simulated peak plus alignment and fragmentation), and a reuse waits only for work the
// simulator had also finished by then. Throws InputError if the graph's stream order contradicts its
// dependencies (the simulator would be stuck too).
RankSchedule make_schedule(const sim::TaskGraph& graph, int rank, int gpus_per_node, std::span<const sim::TaskTiming> predicted = {});

}  // namespace trainyard::backend
