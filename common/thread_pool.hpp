#pragma once
// One small pool of std::threads, shared by the plan search, HotSPa and the GUI's jobs.
//
// for_each(n, job) runs job(0..n-1) on the workers and the calling thread, and returns once every started job
// has finished: an exception thrown by a job stops the hand-out of further indices and is rethrown to the caller
// (the one of the lowest index, so the error does not depend on timing); a set cancel flag stops the hand-out too.
// The caller takes indices itself, so a for_each nested inside a job never waits on a busy pool.
//
// post(priority, job) queues fire-and-forget work (higher priority first, FIFO among equals). An exception from a
// posted job is kept and rethrown by the next wait_idle(), never allowed to end a worker (std::terminate).
// The destructor drops queued work and joins the workers (also when unwinding from an exception).
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace trainyard {

// `threads` resolved: 0 means every core (at least 1).
int resolve_threads(int threads);

class ThreadPool {
 public:
  // `threads` runs for_each at most that wide (0: one per core): threads - 1 workers beside the caller. With no
  // worker, post() runs its job at once on the caller.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }  // workers and the caller

  // At most `parallel` jobs at once (0: size()); see the header comment.
  void for_each(std::size_t n, const std::function<void(std::size_t)>& job, const std::atomic<bool>* cancel = nullptr, int parallel = 0);

  void post(int priority, std::function<void()> job);
  void clear();  // drops queued (not yet started) posted work
  // Blocks until no posted work is queued or running; rethrows the first exception a posted job threw since.
  void wait_idle();

 private:
  void worker_loop();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  // Keyed by (-priority, sequence number): the first entry runs next.
  std::map<std::pair<int, std::uint64_t>, std::function<void()>> queue_;
  std::uint64_t sequence_ = 0;
  int running_ = 0;
  bool stopping_ = false;
  std::exception_ptr posted_error_;
};

// for_each on a pool of `threads` made for the call (1: inline on the caller).
void parallel_for(std::size_t n, int threads, const std::function<void(std::size_t)>& job, const std::atomic<bool>* cancel = nullptr);

}  // namespace trainyard
