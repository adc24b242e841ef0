#include "common/interrupt.hpp"

#include <csignal>

namespace trainyard {

namespace {

std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the flag is set from a signal handler");

extern "C" void on_sigint(int) {
  if (g_interrupted.load()) {  // the second Ctrl-C: stop waiting for the phase to notice
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  g_interrupted.store(true);
}

}  // namespace

void install_interrupt_handler() {
  struct sigaction action {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes carry on; the phases poll the flag
  sigaction(SIGINT, &action, nullptr);
}

const std::atomic<bool>& interrupt_flag() { return g_interrupted; }
bool interrupted() { return g_interrupted.load(); }
void clear_interrupt() { g_interrupted.store(false); }

void throw_if_interrupted() {
  if (interrupted()) throw Interrupted();
}

}  // namespace trainyard
