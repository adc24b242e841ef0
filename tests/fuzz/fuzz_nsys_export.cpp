// libFuzzer target: trainyard::fuzz::load_nsys_export (tests/fuzz/fuzz_loaders.hpp). Any exception but InputError,
// any sanitizer report, leak or timeout is a finding.
#include "tests/fuzz/fuzz_loaders.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return trainyard::fuzz::expect_input_error_only([&] { trainyard::fuzz::load_nsys_export(trainyard::fuzz::text_of(data, size)); });
}
