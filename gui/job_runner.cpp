#include "gui/job_runner.hpp"

#include <malloc.h>

#include <QCoreApplication>
#include <QElapsedTimer>

namespace trainyard::gui {

// Two workers more than cores: the search and a long selected-plan simulation can each hold one (a graph build
// cannot be cancelled) while chart points still get workers. (ThreadPool(n) has n - 1 workers.)
JobRunner::JobRunner(QObject* parent) : QObject(parent), pool_(std::max(1, QThread::idealThreadCount()) + 3) {}

JobRunner::~JobRunner() {
  for (auto& [name, channel] : channels_) {
    channel.cancel->store(true);
    channel.generation->fetch_add(1);
  }
  pool_.clear();
  try {
    pool_.wait_idle();
  } catch (...) {  // jobs catch their own exceptions; nothing may escape a destructor
  }
}

std::shared_ptr<std::atomic<bool>> JobRunner::restart(const std::string& name) {
  Channel& channel = channels_[name];
  channel.cancel->store(true);
  channel.cancel = std::make_shared<std::atomic<bool>>(false);
  channel.generation->fetch_add(1);
  pending_ -= channel.pending;
  channel.pending = 0;
  emit pending_changed(pending_);
  return channel.cancel;
}

JobRunner::Ticket JobRunner::take_ticket(const std::string& name) {
  Channel& channel = channels_[name];
  ++channel.pending;
  ++pending_;
  emit pending_changed(pending_);
  return {name, channel.generation->load(), channel.generation};
}

bool JobRunner::current(const Ticket& t) const {
  const auto it = channels_.find(t.channel);
  return it != channels_.end() && it->second.generation->load() == t.generation;
}

void JobRunner::finished(const Ticket& t) {
  --channels_[t.channel].pending;
  --pending_;
  emit pending_changed(pending_);
}

void JobRunner::dispose(std::shared_ptr<const void> object) {
  pool_.post(-1, [object = std::move(object)]() mutable { object.reset(); });
}

int JobRunner::pending(const std::string& prefix) const {
  int n = 0;
  for (const auto& [name, channel] : channels_) {
    if (name.rfind(prefix, 0) == 0) n += channel.pending;
  }
  return n;
}

bool JobRunner::wait_idle(int timeout_ms) {
  QElapsedTimer timer;
  timer.start();
  while (pending_ > 0 && timer.elapsed() < timeout_ms) {
    QCoreApplication::processEvents(QEventLoop::AllEvents, 20);
    if (pending_ > 0) QThread::msleep(2);
  }
  return pending_ == 0;
}

void release_freed_memory() { malloc_trim(0); }

}  // namespace trainyard::gui
