#include "common/memory_budget.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/error.hpp"

namespace trainyard {

std::int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    std::int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

std::int64_t default_memory_budget_bytes() {
  const std::int64_t available = available_memory_bytes();
  return available > 0 ? std::min(available / 2, kDefaultBudgetCapBytes) : kDefaultBudgetCapBytes;
}

std::int64_t parse_memory_size(const std::string& text, const std::string& flag) {
  const auto bad = [&] { return InputError(flag, "value", "a size such as 512M, 8G or 1.5T (bytes, binary units)", "\"" + text + "\""); };
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  std::string suffix = text.substr(used);
  // "1GB" could mean 10^9 or 2^30 bytes: refused rather than read one way silently (1G and 1GiB are binary).
  if (suffix.size() == 2 && (suffix.back() == 'B' || suffix.back() == 'b') && std::string("KkMmGgTt").find(suffix[0]) != std::string::npos) {
    throw InputError(flag, "value", "binary units, written 1" + suffix.substr(0, 1) + " or 1" + suffix.substr(0, 1) + "iB (or bytes: 1e9)",
                     "\"" + text + "\" (decimal or binary?)");
  }
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
  if (!suffix.empty() && (suffix.back() == 'i')) suffix.pop_back();
  double scale = 1;
  if (suffix == "K" || suffix == "k") scale = 0x1p10;
  else if (suffix == "M" || suffix == "m") scale = 0x1p20;
  else if (suffix == "G" || suffix == "g") scale = 0x1p30;
  else if (suffix == "T" || suffix == "t") scale = 0x1p40;
  else if (!suffix.empty()) throw bad();
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes < 0x1p20 || bytes > 0x1p60) throw bad();
  return static_cast<std::int64_t>(bytes);
}

void MemoryGate::acquire(double bytes) {
  std::unique_lock lock(mutex_);
  freed_.wait(lock, [&] { return holders_ == 0 || held_bytes_ + bytes <= budget_bytes_; });
  held_bytes_ += bytes;
  ++holders_;
}

void MemoryGate::release(double bytes) {
  {
    std::lock_guard lock(mutex_);
    held_bytes_ -= bytes;
    --holders_;
    if (holders_ == 0) held_bytes_ = 0;  // no rounding drift between jobs
  }
  freed_.notify_all();
}

void MemoryGate::give_back(double bytes) {
  {
    std::lock_guard lock(mutex_);
    held_bytes_ -= bytes;
  }
  freed_.notify_all();
}

}  // namespace trainyard
