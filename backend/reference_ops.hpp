#pragma once
// The CPU reference's compute ops (reference_step.cpp), one free function per op over one argument struct, as
// llm.c writes one function per op: each takes a ReferenceOpArgs and reaches its tensors only through the running
// task (ReferenceTask), which checks every read and write against the graph's dataflow. The op table (ops.hpp)
// names each op's tensors; the four linear maps come from its LinearSpec table, as the CUDA executor's do
// (device_ops.hpp). Values are fp32 vectors; what the GPU stores in bf16 is rounded to it (ReferenceOptions).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/model_state.hpp"
#include "backend/ops.hpp"
#include "kernels/reference.hpp"

namespace trainyard::backend {

// The task an op runs in, as the op sees it: its tensors by role (a tensor its op table entry does not name fails
// at once), the graph's shapes to check its work against, and where it adds to gradients.
class ReferenceTask {
 public:
  virtual ~ReferenceTask() = default;
  virtual const std::vector<float>& in(Role role, int kv_chunk = -1) = 0;
  virtual void out(Role role, std::vector<float> data, int kv_chunk = -1) = 0;
  virtual bool holds(Role role, int kv_chunk) const = 0;  // the tensor has a value (an accumulator something added to)
  // The graph's GEMM (attention) for this task must be the one the op runs; InternalError naming the task if not.
  virtual void expect_gemm(std::int64_t m, std::int64_t n, std::int64_t k) const = 0;
  virtual void expect_attention(const sim::Op& op) const = 0;
  virtual void wrote_gradients(int group) = 0;  // a parameter group's gradients were added to (the order checks)
  [[noreturn]] virtual void fail(const std::string& what) const = 0;
};

// One compute op of one chunk (pair), with everything it reads.
struct ReferenceOpArgs {
  const sim::Op* op = nullptr;  // a chunk_ops entry: one chunk (pair), zigzag 0
  ReferenceTask* task = nullptr;
  ModelState* state = nullptr;  // the weights the ops read, the gradients they add to
  std::int64_t chunk_tokens = 0;
  // The rows of the task's GEMM: a zigzag, run or micro-batch task's GEMM spans all its chunks' rows; -1: the op's own.
  std::int64_t task_rows = -1;
  std::span<const std::vector<std::int32_t>> tokens;  // per sequence: its token ids, then the next-token target
  std::int64_t step_tokens = 0;                       // the tokens the step's loss averages over
  bool emulate_bf16 = true;                           // round what is stored in bf16 as the GPU does
  double* loss_sum = nullptr;                         // the LM head's cross-entropy adds its rows' losses here
  std::int64_t* loss_rows = nullptr;                  // ... and counts them here
};

// Runs args.op; the task's fail() for an op the reference does not run.
void run_reference_op(const ReferenceOpArgs& args);

}  // namespace trainyard::backend
