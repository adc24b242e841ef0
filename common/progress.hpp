#pragma once
// A progress line on stderr for phases that can take more than a second: shown only when stderr is a terminal,
// first drawn a second into the phase and redrawn in place (with '\r') at most five times a second; erased when
// the phase ends. When stderr is not a terminal nothing is written, so logs and pipes never get a '\r'.
#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>

namespace trainyard {

class Progress {
 public:
  // `enabled` false (e.g. --json) keeps it silent even on a terminal.
  explicit Progress(std::string phase, bool enabled = true);
  ~Progress();  // erases the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` of `total` units (plans, groups, steps...) named `unit`; any thread may call it.
  void update(std::size_t done, std::size_t total, const std::string& unit = "");
  void set_phase(std::string phase);
  void finish();  // erases the line now

  static bool stderr_is_terminal();

 private:
  std::string phase_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::size_t width_ = 0;
  std::mutex mutex_;
};

}  // namespace trainyard
