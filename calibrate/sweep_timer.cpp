#include "calibrate/sweep_timer.hpp"

#include <algorithm>
#include <cmath>

#include "common/units.hpp"

namespace trainyard::backend {

SweepTimer::SweepTimer(const SweepPlan& plan, Measurements& m, std::ostream* progress, Call drain)
    : plan_(plan), m_(m), progress_(progress), drain_(std::move(drain)), start_(std::chrono::steady_clock::now()) {}

int SweepTimer::calls_per_trial(double call_s) const {
  const double n = std::ceil(plan_.trial_seconds / std::max(call_s, 1e-9));
  return static_cast<int>(std::clamp(n, 1.0, static_cast<double>(plan_.max_calls_per_trial)));
}

std::optional<double> SweepTimer::point(const Trial& trial, const Call& call) {
  for (int i = 0; i < plan_.warmup_calls; ++i) call();
  drain_();
  const double one = trial(call, 1);
  if (one > plan_.max_call_seconds) return std::nullopt;
  const int calls = calls_per_trial(one);
  std::vector<double> per_call;
  for (int r = 0; r < plan_.repeats; ++r) per_call.push_back(trial(call, calls));
  return median_of(per_call);
}

std::optional<std::pair<double, double>> SweepTimer::two_way_point(const TwoWayTrial& both) {
  for (int i = 0; i < plan_.warmup_calls; ++i) both(1);
  const auto [first_one, second_one] = both(1);
  const double slower = std::max(first_one, second_one);
  if (slower > plan_.max_call_seconds) return std::nullopt;
  const int calls = calls_per_trial(slower);
  std::vector<double> first, second;
  for (int r = 0; r < plan_.repeats; ++r) {
    const auto [a, b] = both(calls);
    first.push_back(a);
    second.push_back(b);
  }
  return std::pair{median_of(first), median_of(second)};
}

void SweepTimer::skip(const std::string& what) {
  m_.skipped.push_back(what + ": one call took longer than " + format_number(plan_.max_call_seconds) + " s; larger ones skipped");
}

void SweepTimer::report(const std::string& line) {
  if (progress_) *progress_ << "calibrate: " << line << " (" << format_fixed(elapsed(), 1) << " s)" << std::endl;
}

double SweepTimer::elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

std::string rate_range(const std::vector<KernelPoint>& points, const std::string& unit) {
  if (points.empty()) return "no points";
  const bool tera = unit == "TFLOP/s";
  double lo = 1e300, hi = 0;
  for (const auto& p : points) {
    lo = std::min(lo, p.flops / p.seconds);
    hi = std::max(hi, p.flops / p.seconds);
  }
  const double scale = tera ? 1e-12 : 1e-9;
  const int decimals = tera ? 1 : 2;
  return std::to_string(points.size()) + " points, " + format_fixed(lo * scale, decimals) + " to " + format_fixed(hi * scale, decimals) + " " + unit;
}

std::string bandwidth_range(const std::vector<CopyPoint>& points) {
  double hi = 0;
  for (const auto& p : points) hi = std::max(hi, p.bytes / p.seconds);
  return "up to " + format_fixed(hi * 1e-9, 1) + " GB/s";
}

}  // namespace trainyard::backend
