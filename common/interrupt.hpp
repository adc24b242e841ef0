#pragma once
// Ctrl-C: a SIGINT handler that only sets a flag, which every long phase polls (plan's bounds and waves, max-seq,
// HotSPa, the simulation engine, run's steps). A second Ctrl-C while the first is still being honoured ends the
// process at once (the default action). Commands that stop on the flag exit 130 (128 + SIGINT), after printing
// what they have.
#include <atomic>
#include <stdexcept>

namespace trainyard {

// Installs the handler (idempotent); main() calls it once.
void install_interrupt_handler();
// The flag the handler sets; pass its address as a cancel flag.
const std::atomic<bool>& interrupt_flag();
bool interrupted();
void clear_interrupt();  // tests

inline constexpr int kInterruptedExitCode = 130;

// Thrown where a phase stops on the flag with nothing useful to print; main() turns it into exit 130.
class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted") {}
};
// Throws Interrupted when the flag is set.
void throw_if_interrupted();

}  // namespace trainyard
