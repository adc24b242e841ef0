#pragma once
// What the executor (executor.hpp) needs of a device, after ggml's backend interface: memory, streams, events,
// copies and the op table's kernels on device pointers. Two devices implement it:
//   - CudaDevice (cuda_device.cpp, built with TRAINYARD_CUDA): CUDA streams and events, cuBLASLt and kernels/.
//   - CpuDevice (cpu_device.hpp): streams are threads, events are real synchronisation between them, memory is
//     the process's, kernels are the CPU references of kernels/reference.hpp on bf16 storage. It runs the same
//     schedule, event waits and arena reuse as the GPU, concurrently, so a wait the schedule forgot is a data
//     race that ThreadSanitizer reports (scripts/sanitize.sh tsan runs it).
// Every call that takes a stream is asynchronous: it is queued on that stream and runs after what was queued
// before it there. Waits follow CUDA's rule: wait(stream, event) orders the stream after the event's most recent
// record() at the time of the call (a wait on an event never recorded does not wait). The synchronous calls
// (upload, download, fill) first wait for every stream.
//
// bf16 tensors are passed as their 16-bit patterns; layouts are those of kernels/reference.hpp.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/communicator.hpp"
#include "kernels/reference.hpp"

namespace trainyard::backend {

using bf16_bits = std::uint16_t;

// A buffer of device memory as a message carries it.
struct Bytes {
  void* data = nullptr;
  std::int64_t size = 0;
};
struct ConstBytes {
  const void* data = nullptr;
  std::int64_t size = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;  // "NVIDIA H100 80GB HBM3", "cpu (2 threads per stream)"
  // Why this device cannot run the model's kernels (empty when it can): the CUDA attention's head widths.
  virtual std::string refuses_head_dim(std::int64_t head_dim) const = 0;

  // --- memory ----------------------------------------------------------------------------------------------
  virtual std::int64_t free_bytes() = 0;                  // device memory left
  virtual std::int64_t used_bytes() = 0;                  // device memory in use (the CUDA driver's count, or this device's)
  virtual void* allocate(std::int64_t bytes) = 0;         // device memory ("HBM")
  virtual void* allocate_pinned(std::int64_t bytes) = 0;  // page-locked host memory the copy engines reach
  virtual void release(void* device_memory) noexcept = 0;
  virtual void release_pinned(void* host_memory) noexcept = 0;
  // Per-task scratch, stream-ordered (cudaMallocAsync): usable by work queued after it on `stream`, returned by
  // release_scratch once that work is done. The peak is counted from the last reset.
  virtual void* scratch(int stream, std::int64_t bytes) = 0;
  virtual void release_scratch(int stream, void* p) = 0;
  virtual void reset_scratch_peak() = 0;
  virtual std::int64_t scratch_peak_bytes() = 0;
  // Bytes of device memory each stream keeps for itself (the GEMM library's workspace).
  virtual std::int64_t per_stream_bytes() const = 0;

  // --- synchronous ---------------------------------------------------------------------------------------------
  virtual void upload(void* device_dst, const void* host_src, std::int64_t bytes) = 0;
  virtual void download(void* host_dst, const void* device_src, std::int64_t bytes) = 0;
  virtual void fill(void* device_dst, int byte, std::int64_t bytes) = 0;
  virtual void synchronize() = 0;  // every stream's work done; rethrows the first error one of them met

  // --- streams and events ----------------------------------------------------------------------------------
  virtual int create_stream() = 0;  // 0, 1, 2, ...
  virtual int create_event() = 0;
  virtual void record(int event, int stream) = 0;
  virtual void wait(int stream, int event) = 0;
  virtual double elapsed_ms(int from_event, int to_event) = 0;                        // both recorded and complete
  virtual void copy(int stream, void* dst, const void* src, std::int64_t bytes) = 0;  // any direction
  // `rows` rows of `row_bytes` from `src` (rows `src_pitch` bytes apart) to `dst` (rows `dst_pitch` apart): a
  // column block of a row-major tensor (Ulysses' head groups), as cudaMemcpy2DAsync copies it.
  virtual void copy_2d(int stream, void* dst, std::int64_t dst_pitch, const void* src, std::int64_t src_pitch, std::int64_t row_bytes,
                       std::int64_t rows) = 0;
  virtual void fill(int stream, void* dst, int byte, std::int64_t bytes) = 0;

  // --- kernels (kernels/kernels.hpp and kernels/gemm.hpp say what each computes) ------------------------------
  virtual void gemm(int stream, int m, int n, int k, const bf16_bits* a, bool transpose_a, const bf16_bits* b, bool transpose_b, void* c, bool c_fp32,
                    float alpha, float beta) = 0;
  virtual void attention_forward(int stream, const kernels::AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                                 bf16_bits* o, float* lse) = 0;
  virtual void attention_merge(int stream, int q_len, int heads, int head_dim, float* o_acc, float* lse_acc, const bf16_bits* o_part,
                               const float* lse_part) = 0;
  virtual void attention_backward_prep(int stream, int q_len, int heads, int head_dim, const bf16_bits* o, const bf16_bits* d_o, float* delta) = 0;
  virtual void attention_backward(int stream, const kernels::AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                                  const bf16_bits* d_o, const float* lse, const float* delta, float* dq, float* dk, float* dv) = 0;
  virtual void to_bf16(int stream, const float* x, bf16_bits* y, std::int64_t n) = 0;
  virtual void rmsnorm_forward(int stream, int rows, int cols, float eps, const bf16_bits* x, const bf16_bits* w, bf16_bits* y) = 0;
  virtual void rmsnorm_backward(int stream, int rows, int cols, float eps, const bf16_bits* x, const bf16_bits* w, const bf16_bits* dy, bf16_bits* dx,
                                float* dw) = 0;
  virtual void swiglu_forward(int stream, std::int64_t n, const bf16_bits* gate, const bf16_bits* up, bf16_bits* y) = 0;
  virtual void swiglu_backward(int stream, std::int64_t n, const bf16_bits* gate, const bf16_bits* up, const bf16_bits* dy, bf16_bits* d_gate,
                               bf16_bits* d_up) = 0;
  virtual void add(int stream, std::int64_t n, const bf16_bits* a, const bf16_bits* b, bf16_bits* y) = 0;
  virtual void axpy_f32(int stream, std::int64_t n, float alpha, const float* x, float* y) = 0;  // y += alpha x
  virtual void embedding_forward(int stream, int rows, int hidden, const bf16_bits* table, const std::int32_t* tokens, bf16_bits* y) = 0;
  virtual void embedding_backward(int stream, int rows, int hidden, const std::int32_t* tokens, const bf16_bits* dy, float* dtable) = 0;
  virtual void rope(int stream, int rows, int heads, int head_dim, std::int64_t position_offset, float base, bool inverse, bf16_bits* x) = 0;
  virtual void cross_entropy_forward(int stream, int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, float* loss,
                                     float* lse) = 0;
  virtual void vocab_parallel_merge(int stream, int rows, int shards, const float* stats, float* loss, float* lse) = 0;
  virtual void cross_entropy_backward(int stream, int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, const float* lse,
                                      const float* dloss, bf16_bits* dlogits) = 0;
  virtual void adamw(int stream, const kernels::AdamW& opt, int step, std::int64_t n, float* master, float* m, float* v, const float* grad,
                     bf16_bits* weights) = 0;
  // The same AdamW by the host CPU on pinned host memory (all five buffers), in `stream`'s order (ZeRO-Offload's
  // optimizer step): the CPU device runs it as adamw; a GPU hands it to a host function (cudaLaunchHostFunc)
  // between the stream's copies of the gradients out and of the weights back.
  virtual void host_adamw(int stream, const kernels::AdamW& opt, int step, std::int64_t n, float* master, float* m, float* v, const float* grad,
                          bf16_bits* weights) = 0;

  // --- between ranks ---------------------------------------------------------------------------------------------
  // Before the first step, on every rank at once: the groups (sorted ranks) the step will reduce over. The CPU
  // device uses `comm` itself; the CUDA device bootstraps NCCL through it (nccl_peers.hpp), every wait bounded by
  // `timeout`.
  virtual void prepare_peers(Communicator& comm, const std::vector<std::vector<int>>& groups, std::chrono::milliseconds timeout) = 0;
  // Sums `data` (device memory) over `ranks` in place, through `comm`, queued on `stream` like any other work.
  virtual void all_reduce_sum(int stream, Communicator& comm, std::vector<int> ranks, float* data, std::int64_t n) = 0;
  // The same on bf16 values (tensor parallelism's partial activations): NCCL sums in bf16; MPI has no bf16 sum, so
  // the CPU device sums them as fp32 and rounds the result once.
  virtual void all_reduce_sum(int stream, Communicator& comm, std::vector<int> ranks, bf16_bits* data, std::int64_t n) = 0;
  // A message of `buffers` (device memory, in this order) to rank `peer` under `tag`, queued on `stream`; the peer
  // takes it with recv() into buffers of the same sizes, queued on one of its streams. A send never waits for its
  // receive to be posted on the CPU device (MPI buffers it); on a GPU it may (NCCL), so the receiving rank queues
  // receives on streams of their own (schedule.hpp).
  virtual void send(int stream, Communicator& comm, int peer, int tag, std::vector<ConstBytes> buffers) = 0;
  virtual void recv(int stream, Communicator& comm, int peer, int tag, std::vector<Bytes> buffers) = 0;
  // An all-to-all over `ranks` (this rank among them), queued on `stream`: sends[i] to ranks[i] and recvs[i] from
  // it, under `tag` (this rank's own block copied). NCCL's sends and receives grouped into one call on a GPU; on
  // the CPU device MPI messages, sent first (a send never waits) and then received.
  virtual void all_to_all(int stream, Communicator& comm, const std::vector<int>& ranks, int tag, std::vector<ConstBytes> sends,
                          std::vector<Bytes> recvs) = 0;
};

// A CUDA device (cuda_device.cpp; only in builds with TRAINYARD_CUDA): the current one, or GPU `index` made current
// (one rank per GPU under mpirun).
std::unique_ptr<Device> make_cuda_device(int index = -1);

}  // namespace trainyard::backend
