#pragma once
// The simulator's clock: a binary min-heap keyed by (time in ns, sequence number). Equal times pop in the
// order they were pushed (FIFO), so a run is a pure function of its input.
#include <cstdint>
#include <vector>

#include "common/error.hpp"

namespace trainyard::sim {

// Simulated time stays below 2^62 ns (~146 years) so that sums of times cannot overflow.
inline constexpr std::int64_t kMaxTimeNs = std::int64_t{1} << 62;

struct Event {
  std::int64_t time_ns = 0;
  std::uint64_t seq = 0;
  std::uint32_t kind = 0;     // the engine's event type
  std::int32_t id = 0;        // task or flow
  std::uint32_t version = 0;  // stale-event check for flows and kernels whose completion time moved
};

class EventQueue {
 public:
  void push(std::int64_t time_ns, std::uint32_t kind, std::int32_t id, std::uint32_t version = 0) {
    TRAINYARD_CHECK(time_ns >= now_ns_, "event scheduled in the past");
    heap_.push_back({time_ns, next_seq_++, kind, id, version});
    sift_up(heap_.size() - 1);
  }
  bool empty() const { return heap_.empty(); }
  std::size_t size() const { return heap_.size(); }
  std::int64_t now_ns() const { return now_ns_; }

  Event pop() {
    Event top = heap_.front();
    heap_.front() = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) sift_down(0);
    TRAINYARD_CHECK(top.time_ns >= now_ns_, "simulated time went backwards");
    now_ns_ = top.time_ns;
    return top;
  }

 private:
  static bool before(const Event& a, const Event& b) { return a.time_ns != b.time_ns ? a.time_ns < b.time_ns : a.seq < b.seq; }
  void sift_up(std::size_t i) {
    const Event e = heap_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (!before(e, heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = e;
  }
  void sift_down(std::size_t i) {
    const Event e = heap_[i];
    const std::size_t n = heap_.size();
    while (true) {
      std::size_t child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && before(heap_[child + 1], heap_[child])) ++child;
      if (!before(heap_[child], e)) break;
      heap_[i] = heap_[child];
      i = child;
    }
    heap_[i] = e;
  }

  std::vector<Event> heap_;
  std::uint64_t next_seq_ = 0;
  std::int64_t now_ns_ = 0;
};

}  // namespace trainyard::sim
