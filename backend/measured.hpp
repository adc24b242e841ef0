#pragma once
// A measured step in the simulator's terms, so that the measured timeline is written, compared and summarised by
// the same code as the predicted one (sim/report.hpp, sim/compare.hpp). Plain C++: tested on the CPU with
// recorded timings.
#include <cstdint>
#include <span>

#include "sim/engine.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::backend {

// Time in the step when `gpu`'s compute stream 0 is idle while a copy (H2D or D2H) of that GPU is running: the
// copy time the schedule failed to hide. Tasks with a negative start (not run) are ignored.
std::int64_t exposed_copy_ns(const sim::TaskGraph& graph, std::span<const sim::TaskTiming> timing, sim::DeviceId gpu);

// The prediction with its times replaced by the measurement: step time, task timings, per-stream busy time,
// exposed copy time and peak HBM of GPU 0 (memory levels over time and link loads are dropped: the executor
// does not sample them). FLOP counts and the peak rate stay, so mfu() is the measured MFU.
sim::SimResult measured_result(const sim::SimResult& predicted, const sim::TaskGraph& graph, std::span<const sim::TaskTiming> timing,
                               std::int64_t step_ns, std::int64_t peak_hbm_bytes);

}  // namespace trainyard::backend
