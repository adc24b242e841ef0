#pragma once
// `trainyard compare PREDICTED MEASURED` where MEASURED is an engine's profiler trace (Megatron-LM, DeepSpeed,
// torchtitan: one Kineto trace per rank). The engine's kernels have other names than trainyard's tasks, so nothing
// is matched task by task; the report compares what both sides have, per GPU and per step:
//   - the step: the simulated step against the median of the measured steps (ProfilerStep#N; the profiler's schedule
//     leaves warm-up steps out of the trace);
//   - each task class (traces/kernel_classes.hpp), and the time no rule classifies, with its kernels by name;
//   - each kind of stream (compute, communication, copies in and out): a measured stream is of the kind of the class
//     that takes most of its time;
//   - the plan's assumptions the trace contradicts: GEMMs and collectives per step, and collectives of sizes the plan
//     does not have.
// Kernels belong to the step whose span on the GPU holds them (the device's ProfilerStep#N, which newer PyTorch
// records). Older traces have the host's only: a kernel then belongs to the host step that started last before it,
// and as the host runs ahead, the first step's window may hold none of the work before it while the last loses what
// ran after its host step ended.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/json_reader.hpp"
#include "sim/compare.hpp"
#include "traces/kernel_classes.hpp"
#include "traces/kineto.hpp"

namespace trainyard::traces {

struct EngineComparison {
  std::string predicted_origin, measured_origin;
  int predicted_gpus = 0, measured_ranks = 0, measured_steps = 0;  // the steps compared, summed over the ranks
  bool steps_annotated = true;                                     // false: no ProfilerStep#N in the traces; the whole trace is one step
  sim::ComparisonRow step;
  std::vector<sim::ComparisonRow> by_class;        // per GPU per step (times and counts), classes present on either side
  std::vector<sim::ComparisonRow> by_stream_kind;  // "compute", "communication", "copies in", "copies out"
  struct Kernel {
    std::string name;
    std::int64_t ns = 0;  // per GPU per step
    int count = 0;
  };
  std::vector<Kernel> unclassified;         // the largest ten
  std::vector<std::string> contradictions;  // one sentence each
  std::vector<sim::ComparisonRow> largest;  // the classes by |predicted - measured|, largest first
};

EngineComparison compare_with_engine(const sim::Timeline& predicted, const std::vector<RankTrace>& measured, const KernelClassifier& classes);
// The same over a source of ranks (traces::read_each: one rank's trace in memory at a time, as a large job's traces
// do not fit at once).
EngineComparison compare_with_engine(const sim::Timeline& predicted, const RankSource& next_rank, const KernelClassifier& classes);
void print_engine_comparison(std::ostream& out, const EngineComparison& c);
json::Json engine_comparison_json(const EngineComparison& c);

}  // namespace trainyard::traces
