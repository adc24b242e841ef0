#include "common/thread_pool.hpp"

#include <algorithm>
#include <limits>
#include <memory>

namespace trainyard {

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int threads) {
  const int workers = resolve_threads(threads) - 1;
  workers_.reserve(static_cast<std::size_t>(workers));
  try {
    for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (...) {  // a thread that cannot start: stop the ones that did before leaving
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::worker_loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.begin()->second);
      queue_.erase(queue_.begin());
      ++running_;
    }
    try {
      job();
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!posted_error_) posted_error_ = std::current_exception();
    }
    job = nullptr;  // release what the job holds before reporting idle
    {
      std::lock_guard lock(mutex_);
      --running_;
    }
    idle_.notify_all();
  }
}

void ThreadPool::post(int priority, std::function<void()> job) {
  if (workers_.empty()) {
    try {
      job();
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!posted_error_) posted_error_ = std::current_exception();
    }
    return;
  }
  {
    std::lock_guard lock(mutex_);
    queue_.emplace(std::pair{-priority, sequence_++}, std::move(job));
  }
  wake_.notify_one();
}

void ThreadPool::clear() {
  std::lock_guard lock(mutex_);
  queue_.clear();
  idle_.notify_all();
}

void ThreadPool::wait_idle() {
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return queue_.empty() && running_ == 0; });
    std::swap(error, posted_error_);
  }
  if (error) std::rethrow_exception(error);
}

namespace {

// What one for_each call shares with the runners it posts. Runners that start after the call has returned find
// nothing left to take and never touch `job` (which lived on the caller's stack).
struct ForEach {
  std::mutex mutex;
  std::condition_variable done;
  std::size_t next = 0, n = 0;
  int active = 0;
  bool stop = false;
  std::size_t error_index = std::numeric_limits<std::size_t>::max();
  std::exception_ptr error;
  const std::function<void(std::size_t)>* job = nullptr;
  const std::atomic<bool>* cancel = nullptr;
};

void run_indices(ForEach& s) {
  for (;;) {
    std::size_t i = 0;
    {
      std::lock_guard lock(s.mutex);
      if (s.stop || s.next >= s.n || (s.cancel && s.cancel->load())) return;
      i = s.next++;
      ++s.active;
    }
    std::exception_ptr error;
    try {
      (*s.job)(i);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(s.mutex);
      if (error) {
        s.stop = true;
        if (i < s.error_index) {
          s.error_index = i;
          s.error = std::move(error);
        }
        // Dropped under the lock, before this runner reports done: the exceptions then die on threads the
        // mutex orders, never on a worker after the caller has moved on (found by ThreadSanitizer).
        error = nullptr;
      }
      --s.active;
    }
    s.done.notify_all();
  }
}

}  // namespace

void ThreadPool::for_each(std::size_t n, const std::function<void(std::size_t)>& job, const std::atomic<bool>* cancel, int parallel) {
  if (n == 0) return;
  const auto state = std::make_shared<ForEach>();
  state->n = n;
  state->job = &job;
  state->cancel = cancel;
  const std::size_t wanted = static_cast<std::size_t>(parallel > 0 ? std::min(parallel, size()) : size());
  const std::size_t width = std::min(n, wanted);
  for (std::size_t r = 1; r < width; ++r) {
    std::lock_guard lock(mutex_);
    queue_.emplace(std::pair{std::numeric_limits<int>::min(), sequence_++}, [state] { run_indices(*state); });
  }
  if (width > 1) wake_.notify_all();
  run_indices(*state);
  std::exception_ptr error;
  {
    std::unique_lock lock(state->mutex);
    state->done.wait(lock, [&] { return state->active == 0; });
    state->stop = true;  // runners still queued find nothing to do
    // The exception leaves the shared state: a runner that drops the last reference to it later must not be the
    // one that destroys the exception the caller is handling (found by ThreadSanitizer).
    error = std::move(state->error);
  }
  if (error) std::rethrow_exception(error);
}

void parallel_for(std::size_t n, int threads, const std::function<void(std::size_t)>& job, const std::atomic<bool>* cancel) {
  ThreadPool pool(static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(resolve_threads(threads)), std::max<std::size_t>(n, 1))));
  pool.for_each(n, job, cancel);
}

}  // namespace trainyard
