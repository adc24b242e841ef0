// trainyard: the command-line entry point. Commands parse their flags, call the libraries, and print; errors
// travel up to here as exceptions and become exit codes: 2 for bad input or usage, 1 for internal errors.
#include <iostream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "common/interrupt.hpp"

namespace po = boost::program_options;

namespace {

void print_usage(std::ostream& out) {
  out << "trainyard: plan, simulate and execute long-context LLM training\n\n"
         "usage: trainyard <command> [options]\n\n"
         "commands:\n";
  for (const auto& c : trainyard::app::commands()) out << "  " << c.name << std::string(10 - c.name.size(), ' ') << c.summary << "\n";
  out << "\n'trainyard <command> --help' shows a command's options.\n";
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_usage(std::cerr);
    return 2;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage(std::cout);
    return 0;
  }
  const std::string& name = args[0];
  trainyard::install_interrupt_handler();  // Ctrl-C: long phases stop and the command exits 130
  try {
    for (const auto& command : trainyard::app::commands()) {
      if (command.name == name) return command.run({args.begin() + 1, args.end()});
    }
    std::cerr << "trainyard: unknown command '" << name << "'\n\n";
    print_usage(std::cerr);
    return 2;
  } catch (const po::error& e) {
    std::cerr << "trainyard " << name << ": " << e.what() << "\nTry 'trainyard " << name << " --help'.\n";
    return 2;
  } catch (const trainyard::InputError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const trainyard::Interrupted&) {
    std::cerr << "trainyard " << name << ": interrupted\n";
    return trainyard::kInterruptedExitCode;
  } catch (const std::exception& e) {
    std::cerr << "trainyard: " << e.what() << "\n";
    return 1;
  }
}
