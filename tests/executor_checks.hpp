#pragma once
// What the executor tests hold every device to, against the CPU reference: tests/test_executor_cpu.cpp on the CPU
// device (everywhere), tests/test_gpu_executor.cpp on the CUDA device (where there is a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/executor.hpp"
#include "backend/reference_step.hpp"

namespace trainyard::test {

// One step of `graph` (one GPU) on `device` against the reference on the same weights (`seed`) and tokens: the loss
// within 2e-3 relative and the gradients within 0.03 of each block's largest (bf16 rounding of differently ordered
// work); every dependency holds in the measured timeline, within `slack_ns` (a GPU's events: 1 us; the CPU device's
// one clock: 0). Returns the measured step.
inline backend::MeasuredStep expect_step_matches_reference(backend::Device& device, const sim::TaskGraph& graph, const model::ModelConfig& m,
                                                           std::span<const std::vector<std::int32_t>> tokens, std::uint64_t seed,
                                                           std::int64_t slack_ns) {
  backend::ModelState reference(m, seed), executed(m, seed);
  const backend::ReferenceResult expected = backend::run_reference_step(graph, reference, 1, tokens);
  backend::Executor executor(device, graph, executed, 1, {}, {});
  executor.upload(executed);
  const backend::MeasuredStep measured = executor.run_step(tokens);
  executor.download(executed);
  EXPECT_NEAR(measured.loss, expected.loss, 2e-3 * expected.loss);
  EXPECT_EQ(measured.tokens, expected.tokens);
  EXPECT_LT(backend::max_gradient_difference(executed, reference), 0.03);
  EXPECT_GE(measured.arena_bytes, measured.live_peak_bytes);
  EXPECT_GT(measured.step_ns, 0);
  int checked = 0;
  for (const auto& [a, b] : graph.edges()) {
    const auto& ta = measured.timing[a];
    const auto& tb = measured.timing[b];
    if (ta.start_ns < 0 || tb.start_ns < 0) continue;  // allocations and frees take no time
    EXPECT_LE(ta.end_ns, tb.start_ns + slack_ns) << std::string(graph.name(a)) << " -> " << std::string(graph.name(b));
    ++checked;
  }
  EXPECT_GT(checked, 0);
  return measured;
}

// After one AdamW step of lr 1e-2 on both sides, the share of weights whose master copy agrees within 2e-3 where
// the gradient is not near zero (Adam's first step is sign-like: about lr per entry), and how many there were.
inline std::pair<double, double> adam_agreement(const backend::ModelState& reference, const backend::ModelState& executed) {
  double moved = 0, agree = 0;
  for (std::size_t p = 0; p < reference.all().size(); ++p) {
    const backend::Parameter& a = *reference.all()[p];
    const backend::Parameter& b = *executed.all()[p];
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::abs(a.grad[i]) < 1e-6f) continue;
      moved += 1;
      agree += std::abs(a.master[i] - b.master[i]) < 2e-3f;
    }
  }
  return {moved > 0 ? agree / moved : 0.0, moved};
}

}  // namespace trainyard::test
