#pragma once
// Runs the GUI's simulations on worker threads and hands each result back on the GUI thread, so the window never
// waits on a simulation. Work is grouped in channels (one per chart, one for the search): restarting a channel
// makes its queued jobs skip their work, drops the results of the ones already running, and raises the channel's
// cancel flag (which the planner search polls between waves).
#include <QObject>
#include <QThread>  // idealThreadCount(); main_window.cpp has it from here

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/thread_pool.hpp"

namespace trainyard::gui {

class JobRunner : public QObject {
  Q_OBJECT

 public:
  explicit JobRunner(QObject* parent = nullptr);
  ~JobRunner() override;  // drops queued jobs and waits for the running ones

  // Starts a new generation of `channel`'s work; returns its cancel flag (set when the channel restarts again).
  std::shared_ptr<std::atomic<bool>> restart(const std::string& channel);

  // Runs `work` on a worker thread (higher `priority` first), then `done` with its result, or `failed` with the
  // exception's message, on the GUI thread: only if `channel` has not restarted since.
  template <typename Result>
  void submit(const std::string& channel, int priority, std::function<Result()> work, std::function<void(Result)> done,
              std::function<void(const std::string&)> failed);

  // Releases `object` on a worker thread (freeing a large graph can take longer than a frame).
  void dispose(std::shared_ptr<const void> object);

  int pending() const { return pending_; }               // jobs of the current generations not yet handed back
  int pending(const std::string& channel_prefix) const;  // of the channels whose name starts so
  // Processes events until every current job is handed back, or `timeout_ms` passes; true when idle (tests and
  // --screenshot use it; the window itself never waits).
  bool wait_idle(int timeout_ms);

 signals:
  void pending_changed(int pending);

 private:
  struct Channel {
    // Written on the GUI thread only; shared so that queued work can read it from a worker.
    std::shared_ptr<std::atomic<std::uint64_t>> generation = std::make_shared<std::atomic<std::uint64_t>>(0);
    int pending = 0;
    std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  };
  // The channel's generation as the job was submitted: queued work checks it before starting.
  struct Ticket {
    std::string channel;
    std::uint64_t generation;
    std::shared_ptr<const std::atomic<std::uint64_t>> current;  // the channel's generation now
  };
  Ticket take_ticket(const std::string& channel);
  bool current(const Ticket& t) const;
  void finished(const Ticket& t);  // GUI thread

  ThreadPool pool_;  // common/thread_pool.hpp: the pool the CLI's search and HotSPa use
  std::map<std::string, Channel> channels_;
  int pending_ = 0;
};

// Hands the memory a finished job freed back to the system. glibc keeps each thread's malloc arena at its high-water
// mark, so without this every worker would go on holding the largest graph it ever built (the first picture
// reached 4.8 GiB with four workers).
void release_freed_memory();

template <typename Result>
void JobRunner::submit(const std::string& channel, int priority, std::function<Result()> work, std::function<void(Result)> done,
                       std::function<void(const std::string&)> failed) {
  Ticket ticket = take_ticket(channel);
  pool_.post(priority, [this, ticket, work = std::move(work), done = std::move(done), failed = std::move(failed)] {
    if (ticket.current->load() != ticket.generation) return;  // restarted while queued: skip the work
    std::shared_ptr<Result> result;
    std::string error;
    try {
      result = std::make_shared<Result>(work());
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown error";  // never let an exception end a pool thread (std::terminate)
    }
    release_freed_memory();
    QMetaObject::invokeMethod(
        this,
        [this, ticket, result, error, done, failed]() mutable {
          if (!current(ticket)) {
            if (result) dispose(std::move(result));  // a stale result may be large: freed off this thread
            return;
          }
          finished(ticket);  // before `done`, which may restart this channel and submit more
          if (result) done(std::move(*result));
          else failed(error);
        },
        Qt::QueuedConnection);
  });
}

}  // namespace trainyard::gui
