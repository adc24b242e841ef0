#pragma once
// Shared by the libFuzzer targets: a loader may reject its input only with trainyard::InputError; any other
// exception escapes LLVMFuzzerTestOneInput, aborts, and libFuzzer records the input as a crash.
#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <streambuf>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace trainyard::fuzz {

inline std::string_view text_of(const std::uint8_t* data, std::size_t size) { return {reinterpret_cast<const char*>(data), size}; }

// The file loaders take a path: the input goes to a per-process file with the suffix the loader dispatches on.
inline std::string write_temp(std::string_view text, const std::string& suffix) {
  const char* dir = std::getenv("TMPDIR");
  const std::string path = std::string(dir && *dir ? dir : "/tmp") + "/trainyard-fuzz-" + std::to_string(getpid()) + suffix;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(text.data(), static_cast<std::streamsize>(text.size()));
  return path;
}

// Printing code runs too (reports of what was loaded), into nothing.
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};
inline std::ostream& null_stream() {
  static NullBuffer buffer;
  static std::ostream out(&buffer);
  return out;
}

// Runs `load`; a clean InputError is the expected rejection of bad input.
template <class F>
int expect_input_error_only(F&& load) {
  try {
    load();
  } catch (const InputError&) {
  }
  return 0;
}

}  // namespace trainyard::fuzz
