#pragma once
// The one timing driver both device sweeps use, the CPU device's (calibrate_device.cpp) and the GPU's
// (calibrate_gpu.cpp), as nccl-tests' one TimeTest serves every collective. A sweep supplies how it times n
// back-to-back calls (its trial: the device's events around calls queued behind its gate, a fill on the CPU device,
// a blocking kernel on a GPU) and how it drains its stream; the timer does the rest the same way for both:
// `warmup_calls` untimed calls, one timed call to size the trials (a point whose one call takes longer than
// `max_call_seconds` is skipped), then `repeats` trials of n calls (a trial lasts about `trial_seconds`, at most
// `max_calls_per_trial` calls); the point is the median seconds per call.
#include <chrono>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "calibrate/calibration.hpp"

namespace trainyard::backend {

class SweepTimer {
 public:
  using Call = std::function<void()>;
  using Trial = std::function<double(const Call& call, int calls)>;          // seconds per call of `calls` calls
  using TwoWayTrial = std::function<std::pair<double, double>(int calls)>;  // the same, for two series run at once

  SweepTimer(const SweepPlan& plan, Measurements& m, std::ostream* progress, Call drain);

  std::optional<double> point(const Trial& trial, const Call& call);
  // Two series timed together (copies both ways at once): the median of each; nullopt when either is too slow.
  std::optional<std::pair<double, double>> two_way_point(const TwoWayTrial& both);
  int calls_per_trial(double call_s) const;

  // Records that `what` was skipped because one call took longer than the plan allows.
  void skip(const std::string& what);
  void report(const std::string& line);  // a progress line, with the seconds since the sweep began
  double elapsed() const;
  const SweepPlan& plan() const { return plan_; }
  Measurements& measurements() { return m_; }

 private:
  const SweepPlan& plan_;
  Measurements& m_;
  std::ostream* progress_;
  Call drain_;
  std::chrono::steady_clock::time_point start_;
};

// "12 points, 0.52 to 3.10 GFLOP/s" (unit: "GFLOP/s", two decimals, or "TFLOP/s", one); "no points" when empty.
std::string rate_range(const std::vector<KernelPoint>& points, const std::string& unit);
std::string bandwidth_range(const std::vector<CopyPoint>& points);  // "up to 24.1 GB/s"

}  // namespace trainyard::backend
