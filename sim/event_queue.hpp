#pragma once
// The simulator's clock: a min-heap keyed by (time in ns, sequence number). Equal times pop in the
// order they were pushed (FIFO), so a run is a pure function of its input.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/error.hpp"

namespace trainyard::sim {

// Simulated time stays below 2^62 ns (~146 years) so that sums of times cannot overflow.
inline constexpr std::int64_t kMaxTimeNs = std::int64_t{1} << 62;

struct Event {
  std::int64_t time_ns = 0;
  std::uint64_t order = 0;    // push sequence number, then the kind in the low bits: ties pop FIFO
  std::int32_t id = 0;        // task or flow
  std::uint32_t version = 0;  // stale-event check for flows and kernels whose completion time moved
  static constexpr int kKindBits = 2;
  std::uint32_t kind() const { return static_cast<std::uint32_t>(order & ((1u << kKindBits) - 1)); }  // the engine's event type
};

// A 4-ary heap of 24-byte events (the kind rides in the sequence number): fewer levels than a binary heap, and a
// node's children share cache lines.
class EventQueue {
 public:
  void push(std::int64_t time_ns, std::uint32_t kind, std::int32_t id, std::uint32_t version = 0) {
    TRAINYARD_CHECK(time_ns >= now_ns_, "event scheduled in the past");
    TRAINYARD_CHECK(kind < (1u << Event::kKindBits), "event kind out of range");
    heap_.push_back({time_ns, (next_seq_++ << Event::kKindBits) | kind, id, version});
    sift_up(heap_.size() - 1);
  }
  bool empty() const { return heap_.empty(); }
  std::size_t size() const { return heap_.size(); }
  std::int64_t now_ns() const { return now_ns_; }

  Event pop() {
    const Event top = heap_.front();
    const Event last = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) sift_down(last);
    TRAINYARD_CHECK(top.time_ns >= now_ns_, "simulated time went backwards");
    now_ns_ = top.time_ns;
    return top;
  }

 private:
  static constexpr std::size_t kArity = 4;
  static bool before(const Event& a, const Event& b) { return a.time_ns != b.time_ns ? a.time_ns < b.time_ns : a.order < b.order; }
  void sift_up(std::size_t i) {
    const Event e = heap_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / kArity;
      if (!before(e, heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = e;
  }
  // Places `e` (the former last element) from the root down.
  void sift_down(const Event e) {
    const std::size_t n = heap_.size();
    std::size_t i = 0;
    while (true) {
      const std::size_t first = kArity * i + 1;
      if (first >= n) break;
      const std::size_t end = std::min(first + kArity, n);
      std::size_t best = first;
      for (std::size_t c = first + 1; c < end; ++c) {
        if (before(heap_[c], heap_[best])) best = c;
      }
      if (!before(heap_[best], e)) break;
      heap_[i] = heap_[best];
      i = best;
    }
    heap_[i] = e;
  }

  std::vector<Event> heap_;
  std::uint64_t next_seq_ = 0;
  std::int64_t now_ns_ = 0;
};

}  // namespace trainyard::sim
