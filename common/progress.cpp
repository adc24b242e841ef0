#include "common/progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace trainyard {

bool Progress::stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string phase, bool enabled)
    : phase_(std::move(phase)), enabled_(enabled && stderr_is_terminal()), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::set_phase(std::string phase) {
  std::lock_guard lock(mutex_);
  phase_ = std::move(phase);
}

void Progress::update(std::size_t done, std::size_t total, const std::string& unit) {
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  const double elapsed_s = std::chrono::duration<double>(now - start_).count();
  if (elapsed_s < 1.0 || (drawn_ && now - last_draw_ < std::chrono::milliseconds(200) && done < total)) return;
  last_draw_ = now;
  std::string line = phase_ + ": " + std::to_string(done) + "/" + std::to_string(total) + (unit.empty() ? "" : " " + unit);
  if (done > 0 && done < total) {
    const double eta_s = elapsed_s * static_cast<double>(total - done) / static_cast<double>(done);
    line += ", " + std::to_string(static_cast<long long>(elapsed_s)) + " s, ETA " + std::to_string(static_cast<long long>(eta_s + 0.5)) + " s";
  }
  const std::size_t pad = width_ > line.size() ? width_ - line.size() : 0;
  width_ = line.size();
  std::fprintf(stderr, "\r%s%s", line.c_str(), std::string(pad, ' ').c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  std::lock_guard lock(mutex_);
  if (!drawn_) return;
  std::fprintf(stderr, "\r%s\r", std::string(width_, ' ').c_str());
  std::fflush(stderr);
  drawn_ = false;
  width_ = 0;
}

}  // namespace trainyard
