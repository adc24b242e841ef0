#pragma once
// The CUDA executor's compute ops (executor.cpp), one free function per op over one argument struct, as
// flash-attention's kernels take one params struct: everything an op reads is in DeviceOpArgs, filled once per
// chunk (pair) of a task. The op table (ops.hpp) names each op's tensors; the four linear maps come from its
// LinearSpec table. Plain C++ over the Device interface: the CPU device runs these too.
#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/dataflow.hpp"
#include "backend/device.hpp"
#include "backend/ops.hpp"

namespace trainyard::backend {

// A parameter's device copies; weights bf16, the rest fp32.
struct DeviceParameter {
  std::string name;
  std::int64_t n = 0;
  bool decays = true;  // Parameter::decays
  bf16_bits* weight = nullptr;
  float *master = nullptr, *m = nullptr, *v = nullptr;  // pinned host memory where the optimizer runs on the host
  float* grad = nullptr;                                // in its group's gradient buffer (GroupGradients)
  float* last_sum = nullptr;                            // a group reduced several times a step: in its group's last reduced gradient (else null)
  // The optimizer on the host: in its group's pinned copies of the gradients and of the updated weights.
  float* host_grad = nullptr;
  bf16_bits* host_weight = nullptr;
  bool weights_on_host = false;  // ZeRO-Infinity: the host's copy is the parameter's weights; the device's a transient one
};

// Where the step's tensors live: the dataflow plan's instance i, in the device arena or in pinned host memory.
struct TensorMemory {
  const DataflowPlan* flow = nullptr;
  void* arena = nullptr;
  void* pinned = nullptr;
  void* at(int instance) const;
};

// One compute op of one chunk (pair), with everything its kernels take.
struct DeviceOpArgs {
  Device* dev = nullptr;
  int stream = 0;
  const sim::Op* op = nullptr;         // a chunk_ops entry: one chunk (pair), zigzag 0
  const OpTensors* tensors = nullptr;  // its tensors by role: slots are TensorMemory instances
  TensorMemory memory;
  const model::ModelConfig* model = nullptr;  // this rank's: the model, or its tensor-parallel shard
  std::int64_t chunk_tokens = 0;
  // Tensor parallelism: this rank holds shard `shard` of `shards`. Under sequence parallelism it also holds rows
  // [shard * chunk_tokens / shards, (shard + 1) * chunk_tokens / shards) of each chunk between the TP regions, where the ops
  // (norms, residuals and their backwards, the final norm's) touch only those rows.
  int shard = 0, shards = 1;
  bool sequence_parallel = false;
  std::array<const DeviceParameter*, kLayerWeights> layer{};  // the op's layer's weights (LayerWeight order); null outside a layer
  const DeviceParameter *embedding = nullptr, *final_norm = nullptr, *lm_head = nullptr;
  const std::int32_t* tokens = nullptr;  // the op's chunk's token ids (the targets follow, one on)
  float* losses = nullptr;               // the op's chunk's per-token losses
  const float* dloss = nullptr;          // 1 / tokens, one per row of a chunk

  // The op's tensors by name, as the type the kernels take: one the entry does not name, or names with another
  // dtype, throws before anything is enqueued.
  template <typename T>
  static constexpr ElementType dtype_of = std::is_same_v<T, float> ? ElementType::fp32 : ElementType::bf16;
  template <typename T>
  const T* in(Role role, int kv_chunk = -1) const {
    return static_cast<const T*>(memory.at(tensors->read(role, dtype_of<T>, kv_chunk)));
  }
  template <typename T>
  T* out(Role role, int kv_chunk = -1) const {
    return static_cast<T*>(memory.at(tensors->write(role, dtype_of<T>, kv_chunk)));
  }
  template <typename T>
  T* scratch(std::int64_t count) const {
    return static_cast<T*>(dev->scratch(stream, count * static_cast<std::int64_t>(sizeof(T))));
  }
  void release(void* p) const { dev->release_scratch(stream, p); }
  const DeviceParameter& weights(LayerWeight w) const { return *layer[static_cast<std::size_t>(w)]; }
};

// Runs args.op's kernels on args.stream; InternalError for an op the executor does not run.
void run_device_op(const DeviceOpArgs& args);

}  // namespace trainyard::backend
