#pragma once
// Large arrays (a step graph's tasks, names and edges; the engine's per-task state) in transparent huge pages,
// which Linux gives on request (Debian's default THP mode is "madvise"). A graph of millions of tasks otherwise
// takes a page fault per 4 KiB as it grows and a TLB miss on most of the simulator's reads, which go all over it:
// on the 1T Megatron step (6.4 M tasks) the two were half of the whole process's time (benchmarks/results/sim.md).
// Where huge pages are not offered, the advice is ignored and the memory is ordinary.
#include <sys/mman.h>

#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace trainyard {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
// Smaller arrays keep ordinary pages: a huge page would be mostly empty, and many graphs are small.
inline constexpr std::size_t kHugePageMinArrayBytes = 4 * kHugePageBytes;

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n * sizeof(T) < kHugePageMinArrayBytes) return std::allocator<T>{}.allocate(n);
    const std::size_t bytes = whole_pages(n * sizeof(T));
    void* p = ::operator new (bytes, std::align_val_t{kHugePageBytes});
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);  // advice: failing it only leaves the pages small
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) < kHugePageMinArrayBytes) {
      std::allocator<T>{}.deallocate(p, n);
    } else {
      ::operator delete (p, std::align_val_t{kHugePageBytes});
    }
  }
  friend bool operator==(const HugePageAllocator&, const HugePageAllocator&) { return true; }

 private:
  static std::size_t whole_pages(std::size_t bytes) { return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }
};

template <class T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace trainyard
