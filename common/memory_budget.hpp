#pragma once
// How much memory a command may use for what it builds (task graphs, simulation state, tensors): by default
// half of the machine's available memory (/proc/meminfo MemAvailable), capped at kDefaultBudgetCapBytes so that
// no input drives a command much past 2 GiB; --memory-budget raises (or lowers) it.
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

namespace trainyard {

inline constexpr std::int64_t kDefaultBudgetCapBytes = std::int64_t{1536} << 20;  // leaves room for the rest under 2 GiB

// MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read.
std::int64_t available_memory_bytes();
std::int64_t default_memory_budget_bytes();
// "8G", "512M", "1.5G", "4096" (bytes; K, M, G, T binary); InputError naming `flag` otherwise.
std::int64_t parse_memory_size(const std::string& text, const std::string& flag);

// Lets concurrent jobs hold estimated memory up to a budget together: acquire(bytes) waits until what the others
// hold plus `bytes` fits, or until nobody holds anything (a job larger than the budget alone still runs, alone).
// The plan search simulates as many candidates at once as fit, instead of sizing every slot for the largest.
class MemoryGate {
 public:
  explicit MemoryGate(double budget_bytes) : budget_bytes_(budget_bytes) {}
  void acquire(double bytes);
  void release(double bytes);
  void give_back(double bytes);  // part of a hold, which stays held
  double budget_bytes() const { return budget_bytes_; }

  // Holds `bytes` of the gate for its lifetime.
  class Hold {
   public:
    Hold(MemoryGate& gate, double bytes) : gate_(gate), bytes_(bytes) { gate_.acquire(bytes_); }
    ~Hold() { gate_.release(bytes_); }
    // Holds less from now on (never more): once a job knows what it really needs, the rest goes to the waiters.
    void shrink_to(double bytes) {
      if (bytes >= bytes_) return;
      gate_.give_back(bytes_ - bytes);
      bytes_ = bytes;
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    MemoryGate& gate_;
    double bytes_;
  };

 private:
  const double budget_bytes_;
  std::mutex mutex_;
  std::condition_variable freed_;
  double held_bytes_ = 0;
  int holders_ = 0;
};

}  // namespace trainyard
