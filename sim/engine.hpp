#pragma once
// The discrete-event simulation of one training step: in-order streams per GPU (compute, H2D and D2H copy
// engines, comm), transfers as max-min fair flows over the cluster topology, collectives decomposed into their
// algorithm's steps, and memory pools (HBM per GPU, pinned DRAM per node) tracked over time.
#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hwprofiles/topology.hpp"
#include "sim/cluster.hpp"
#include "sim/task_graph.hpp"
#include "stacks/collective_library.hpp"
#include "stacks/stack_profile.hpp"

namespace trainyard::sim {

struct SimOptions {
  bool record_memory = true;  // memory level per pool after every alloc/free (trace counters)
  bool record_links = true;   // load per link after every rate change (trace counters)
  // Polled every few thousand events: once set, the run stops early with stuck = "cancelled" (the GUI drops a
  // simulation whose inputs changed instead of finishing it).
  const std::atomic<bool>* cancel = nullptr;
  // The collective library's protocol costs; null: stacks::default_collective_library() (NCCL).
  const stacks::CollectiveLibrary* collectives = nullptr;
};

struct TaskTiming {
  std::int64_t start_ns = -1;
  std::int64_t end_ns = -1;
};

struct Sample {
  std::int64_t time_ns = 0;
  double value = 0;
};

struct PoolUsage {
  std::string name;  // "gpu3 hbm", "host0 dram"
  std::int64_t capacity_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::vector<Sample> level;  // bytes in use over time
};

struct LinkUsage {
  std::string name;  // "sw0->cpu0" (per direction) or "cpu0<->dram0" (shared)
  hw::LinkType type = hw::LinkType::pcie;
  double capacity_GBps = 0;
  double bytes = 0;
  std::int64_t busy_ns = 0;  // time with at least one flow
  std::vector<Sample> load_GBps;
};

struct StreamUsage {
  DeviceId device = 0;
  Stream stream;
  std::int64_t busy_ns = 0;
};

struct OomReport {
  TaskId task = -1;
  std::string pool;
  std::int64_t requested_bytes = 0;
  std::int64_t in_use_bytes = 0;
  std::int64_t capacity_bytes = 0;
  std::int64_t excess_bytes = 0;
  std::vector<std::pair<std::string, std::int64_t>> largest_live;  // label, bytes; largest first
  std::string describe(const TaskGraph& graph) const;
};

struct SimResult {
  bool completed = false;
  std::optional<OomReport> oom;
  std::string stuck;  // when the run could not finish for another reason (stream-order deadlock)
  std::int64_t step_ns = 0;
  HugePageVector<TaskTiming> timing;  // per task (common/huge_pages.hpp)
  std::vector<PoolUsage> pools;       // GPUs' HBM first (index = GPU), then each node's DRAM
  std::vector<LinkUsage> links;       // only resources that carried traffic
  std::vector<StreamUsage> streams;
  std::vector<std::int64_t> exposed_transfer_ns;  // per GPU: compute stream 0 idle waiting on a transfer
  double model_flops = 0;
  double hardware_flops = 0;
  int gpus = 0;
  double peak_flops_per_gpu = 0;  // bf16 dense
  std::uint64_t events = 0;
  std::uint64_t flow_recomputes = 0;  // rate recomputations (one per flow start or end)
  double mean_component_flows = 0;    // flows covered per recomputation
  std::uint64_t max_concurrent_flows = 0;
  std::size_t engine_bytes = 0;  // the engine's per-task state (timings included), for memory-per-task figures
  // The protocol each collective ran with (an index into protocol_names), collective tasks only.
  std::vector<std::pair<TaskId, std::uint8_t>> collective_protocols;
  std::vector<std::string> protocol_names;
  // The stack the step ran under: its attention kernel, and what it reserves on each GPU beyond the pools'
  // allocations (the HBM pools' capacity is what its allocator can hand out).
  std::string stack;
  std::string attention_impl;
  double hbm_fixed_bytes = 0;
  double allocator_overhead = 0;
  double hbm_reserved_bytes(double allocated_bytes) const { return allocated_bytes * (1 + allocator_overhead) + hbm_fixed_bytes; }
  // Per class of compute task (gemm, attention, elementwise, optimizer): busy time and FLOPs, summed over GPUs.
  struct ClassTotals {
    std::int64_t busy_ns = 0;
    double model_flops = 0;
    double hbm_bytes = 0;
    std::int64_t tasks = 0;
  };
  std::array<ClassTotals, 4> compute_classes{};
  std::int64_t host_wait_ns = 0;  // GPU time lost waiting for the host to issue kernels, summed over GPUs
  // GEMM and attention time added because running collectives held SMs (gpu.sustained.collective_ctas),
  // summed over GPUs.
  std::int64_t collective_sm_ns = 0;

  double mfu() const;
  double hfu() const;
};

SimResult simulate(const TaskGraph& graph, const Cluster& cluster, const SimOptions& options = {});

}  // namespace trainyard::sim
