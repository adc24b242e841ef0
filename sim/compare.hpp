#pragma once
// `trainyard compare`: a predicted timeline (the simulator's) against a measured one (the executor's), both
// Chrome traces written by write_chrome_trace. Per task class and per stream: total time predicted and measured
// and the error; the step time and peak HBM errors; the tasks with the largest absolute difference. This is the
// report that tells a user whether to trust the planner on their hardware.
//
// Errors are (predicted - measured) / measured: +10% means the simulator expected 10% more time than it took.
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "common/json_reader.hpp"

namespace trainyard::sim {

struct TimelineSlice {
  std::string name;        // the task's name: unique per device
  int pid = 0;             // the trace's process: a GPU or a host
  int tid = 0;             // the stream within it
  std::string task_class;  // task_class() of the task
  std::int64_t start_ns = 0, duration_ns = 0;
  std::int64_t bytes = 0;  // a collective's, send's or copy's bytes (args.bytes; 0 when absent)
};

struct Timeline {
  std::string origin;  // the file it was read from
  std::string source;  // "simulated" or "measured"
  std::int64_t step_ns = 0;
  std::vector<std::int64_t> peak_hbm_bytes;  // per GPU
  std::vector<TimelineSlice> slices;
  std::map<int, std::string> process_names;                 // pid -> "gpu0" style name
  std::map<std::pair<int, int>, std::string> stream_names;  // (pid, tid) -> "compute0"
  // The span of the step the file holds (otherData.selection: simulate --trace-window trims it); -1: to the end.
  std::int64_t window_start_ns = 0, window_end_ns = -1;
  bool whole_step() const { return window_start_ns <= 0 && (window_end_ns < 0 || window_end_ns >= step_ns); }
  std::string device_label(int pid) const;           // "gpu0"
  std::string stream_label(int pid, int tid) const;  // "gpu0 compute0"
};

// Reads a trace written by write_chrome_trace; anything else is an InputError naming the file and the field.
Timeline parse_timeline(const json::Json& document, const std::string& origin);
// InputError naming the file unless `t` holds its whole step: per-step totals of a trimmed timeline would be short.
void require_whole_step(const Timeline& t);
Timeline read_timeline(const std::string& path);

// The task classes (sim/report.hpp task_class) in the order a comparison lists them.
const std::vector<std::string>& task_classes();

struct ComparisonRow {
  std::string what;  // a task class, a stream, or "step"
  std::int64_t predicted_ns = 0, measured_ns = 0;
  int predicted_count = 0, measured_count = 0;
  double error() const;  // (predicted - measured) / measured; 0 when both are 0
};

struct Comparison {
  ComparisonRow step;
  std::vector<ComparisonRow> by_class;                                     // in a fixed order (gemm, attention fwd, ...), classes present only
  std::vector<ComparisonRow> by_stream;                                    // every stream present in either timeline
  std::int64_t predicted_peak_hbm_bytes = 0, measured_peak_hbm_bytes = 0;  // the largest over GPUs
  double peak_hbm_error() const;
  struct Difference {
    std::string name, stream;
    std::int64_t predicted_ns = 0, measured_ns = 0;
  };
  std::vector<Difference> largest;            // the ten matched tasks with the largest |predicted - measured|
  int only_predicted = 0, only_measured = 0;  // slices without a counterpart (name and device)
};

// Throws InputError if the two timelines share no task: they are not of the same plan.
Comparison compare(const Timeline& predicted, const Timeline& measured);
void print_comparison(std::ostream& out, const Comparison& c);
json::Json comparison_json(const Comparison& c);

}  // namespace trainyard::sim
