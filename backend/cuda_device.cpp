// The CUDA device: the executor's Device calls as CUDA runtime calls, cuBLASLt GEMMs (one kernels::Gemm, with its
// workspace, per stream) and kernels/. Scratch comes from the device's default stream-ordered pool.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/device.hpp"
#include "backend/nccl_peers.hpp"
#include "common/error.hpp"
#include "kernels/gemm.hpp"
#include "kernels/kernels.hpp"
#include "kernels/reference.hpp"

namespace trainyard::backend {

namespace {

std::size_t size_of(std::int64_t bytes) { return static_cast<std::size_t>(std::max<std::int64_t>(bytes, 0)); }

class CudaDevice final : public Device {
  // One host_adamw call, run by the CUDA driver's thread when the stream gets there.
  struct HostAdamW {
    CudaDevice* device;
    kernels::AdamW opt;
    int step;
    std::int64_t n;
    float *master, *m, *v;
    const float* grad;
    bf16_bits* weights;
    static void CUDART_CB run(void* p) noexcept {
      const std::unique_ptr<HostAdamW> job(static_cast<HostAdamW*>(p));
      try {
        kernels::adamw_host(job->opt, job->step, job->n, job->master, job->m, job->v, job->grad, job->weights);  // on every host core
      } catch (const std::exception& e) {
        const std::lock_guard lock(job->device->host_error_mutex_);
        if (job->device->host_error_.empty()) job->device->host_error_ = e.what();
      }
    }
  };

 public:
  // Touches nothing on the GPU until used: the executor refuses what it cannot run before that, GPU or not.
  CudaDevice() = default;
  // Errors are ignored here: it runs while an error may already be on its way up.
  ~CudaDevice() override {
    if (!streams_.empty()) cudaDeviceSynchronize();
    for (auto e : events_) cudaEventDestroy(e);
    gemms_.clear();
    for (auto s : streams_) cudaStreamDestroy(s);
  }

  std::string name() const override {
    int device = 0;
    TRAINYARD_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    TRAINYARD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    return prop.name;
  }
  std::string refuses_head_dim(std::int64_t head_dim) const override {
    return kernels::attention_supports_head_dim(head_dim) ? "" : "64 or 128 (the CUDA attention kernels' widths)";
  }

  std::int64_t free_bytes() override {
    std::size_t free = 0, total = 0;
    TRAINYARD_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<std::int64_t>(free);
  }
  std::int64_t used_bytes() override {
    std::size_t free = 0, total = 0;
    TRAINYARD_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<std::int64_t>(total - free);
  }
  void* allocate(std::int64_t bytes) override {
    void* p = nullptr;
    TRAINYARD_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(size_of(bytes), 1)));
    return p;
  }
  void* allocate_pinned(std::int64_t bytes) override {
    void* p = nullptr;
    TRAINYARD_CUDA_CHECK(cudaMallocHost(&p, std::max<std::size_t>(size_of(bytes), 1)));
    return p;
  }
  void release(void* p) noexcept override { cudaFree(p); }
  void release_pinned(void* p) noexcept override { cudaFreeHost(p); }
  void* scratch(int stream, std::int64_t bytes) override {
    void* p = nullptr;
    TRAINYARD_CUDA_CHECK(cudaMallocAsync(&p, size_of(bytes), streams_.at(stream)));
    return p;
  }
  void release_scratch(int stream, void* p) override { TRAINYARD_CUDA_CHECK(cudaFreeAsync(p, streams_.at(stream))); }
  void reset_scratch_peak() override {
    std::uint64_t zero = 0;
    TRAINYARD_CUDA_CHECK(cudaMemPoolSetAttribute(pool(), cudaMemPoolAttrUsedMemHigh, &zero));
  }
  std::int64_t scratch_peak_bytes() override {
    std::uint64_t high = 0;
    TRAINYARD_CUDA_CHECK(cudaMemPoolGetAttribute(pool(), cudaMemPoolAttrUsedMemHigh, &high));
    return static_cast<std::int64_t>(high);
  }
  std::int64_t per_stream_bytes() const override { return static_cast<std::int64_t>(kernels::Gemm::kWorkspaceBytes); }

  // The streams are non-blocking, so a plain cudaMemcpy would not wait for them: synchronize first.
  void upload(void* dst, const void* src, std::int64_t bytes) override {
    synchronize();
    TRAINYARD_CUDA_CHECK(cudaMemcpy(dst, src, size_of(bytes), cudaMemcpyHostToDevice));
  }
  void download(void* dst, const void* src, std::int64_t bytes) override {
    synchronize();
    TRAINYARD_CUDA_CHECK(cudaMemcpy(dst, src, size_of(bytes), cudaMemcpyDeviceToHost));
  }
  void fill(void* dst, int byte, std::int64_t bytes) override {
    synchronize();
    TRAINYARD_CUDA_CHECK(cudaMemset(dst, byte, size_of(bytes)));
  }
  // With other ranks, a collective that never completes must not hang the wait: it is bounded first (NcclPeers::wait).
  void synchronize() override {
    if (peers_) peers_->wait(streams_);
    TRAINYARD_CUDA_CHECK(cudaDeviceSynchronize());
    const std::lock_guard lock(host_error_mutex_);
    if (!host_error_.empty()) throw InternalError("the host's optimizer step: " + host_error_, __FILE__, __LINE__);
  }

  int create_stream() override {
    cudaStream_t s = nullptr;
    TRAINYARD_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams_.push_back(s);
    gemms_.push_back(std::make_unique<kernels::Gemm>());
    return static_cast<int>(streams_.size()) - 1;
  }
  int create_event() override {
    cudaEvent_t e = nullptr;
    TRAINYARD_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    return static_cast<int>(events_.size()) - 1;
  }
  void record(int event, int stream) override { TRAINYARD_CUDA_CHECK(cudaEventRecord(events_.at(event), streams_.at(stream))); }
  void wait(int stream, int event) override { TRAINYARD_CUDA_CHECK(cudaStreamWaitEvent(streams_.at(stream), events_.at(event), 0)); }
  double elapsed_ms(int from, int to) override {
    float ms = 0;
    TRAINYARD_CUDA_CHECK(cudaEventElapsedTime(&ms, events_.at(from), events_.at(to)));
    return ms;
  }
  void copy(int stream, void* dst, const void* src, std::int64_t bytes) override {
    TRAINYARD_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_of(bytes), cudaMemcpyDefault, streams_.at(stream)));
  }
  void fill(int stream, void* dst, int byte, std::int64_t bytes) override {
    TRAINYARD_CUDA_CHECK(cudaMemsetAsync(dst, byte, size_of(bytes), streams_.at(stream)));
  }
  void copy_2d(int stream, void* dst, std::int64_t dst_pitch, const void* src, std::int64_t src_pitch, std::int64_t row_bytes,
               std::int64_t rows) override {
    TRAINYARD_CUDA_CHECK(cudaMemcpy2DAsync(dst, size_of(dst_pitch), src, size_of(src_pitch), size_of(row_bytes), size_of(rows), cudaMemcpyDefault,
                                           streams_.at(stream)));
  }

  void gemm(int stream, int m, int n, int k, const bf16_bits* a, bool ta, const bf16_bits* b, bool tb, void* c, bool c_fp32, float alpha,
            float beta) override {
    gemms_.at(stream)->run(m, n, k, a, ta, b, tb, c, c_fp32, alpha, beta, streams_.at(stream));
  }
  void attention_forward(int stream, const kernels::AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o,
                         float* lse) override {
    kernels::attention_forward(s, q, k, v, o, lse, streams_.at(stream));
  }
  void attention_merge(int stream, int q_len, int heads, int head_dim, float* o_acc, float* lse_acc, const bf16_bits* o_part,
                       const float* lse_part) override {
    kernels::attention_merge(q_len, heads, head_dim, o_acc, lse_acc, o_part, lse_part, streams_.at(stream));
  }
  void attention_backward_prep(int stream, int q_len, int heads, int head_dim, const bf16_bits* o, const bf16_bits* d_o, float* delta) override {
    kernels::attention_backward_prep(q_len, heads, head_dim, o, d_o, delta, streams_.at(stream));
  }
  void attention_backward(int stream, const kernels::AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                          const bf16_bits* d_o, const float* lse, const float* delta, float* dq, float* dk, float* dv) override {
    kernels::attention_backward(s, q, k, v, d_o, lse, delta, dq, dk, dv, streams_.at(stream));
  }
  void to_bf16(int stream, const float* x, bf16_bits* y, std::int64_t n) override { kernels::to_bf16(x, y, n, streams_.at(stream)); }
  void rmsnorm_forward(int stream, int rows, int cols, float eps, const bf16_bits* x, const bf16_bits* w, bf16_bits* y) override {
    kernels::rmsnorm_forward(rows, cols, eps, x, w, y, streams_.at(stream));
  }
  void rmsnorm_backward(int stream, int rows, int cols, float eps, const bf16_bits* x, const bf16_bits* w, const bf16_bits* dy, bf16_bits* dx,
                        float* dw) override {
    kernels::rmsnorm_backward(rows, cols, eps, x, w, dy, dx, dw, streams_.at(stream));
  }
  void swiglu_forward(int stream, std::int64_t n, const bf16_bits* gate, const bf16_bits* up, bf16_bits* y) override {
    kernels::swiglu_forward(n, gate, up, y, streams_.at(stream));
  }
  void swiglu_backward(int stream, std::int64_t n, const bf16_bits* gate, const bf16_bits* up, const bf16_bits* dy, bf16_bits* d_gate,
                       bf16_bits* d_up) override {
    kernels::swiglu_backward(n, gate, up, dy, d_gate, d_up, streams_.at(stream));
  }
  void add(int stream, std::int64_t n, const bf16_bits* a, const bf16_bits* b, bf16_bits* y) override {
    kernels::add(n, a, b, y, streams_.at(stream));
  }
  void axpy_f32(int stream, std::int64_t n, float alpha, const float* x, float* y) override {
    kernels::axpy_f32(n, alpha, x, y, streams_.at(stream));
  }
  void embedding_forward(int stream, int rows, int hidden, const bf16_bits* table, const std::int32_t* tokens, bf16_bits* y) override {
    kernels::embedding_forward(rows, hidden, table, tokens, y, streams_.at(stream));
  }
  void embedding_backward(int stream, int rows, int hidden, const std::int32_t* tokens, const bf16_bits* dy, float* dtable) override {
    kernels::embedding_backward(rows, hidden, tokens, dy, dtable, streams_.at(stream));
  }
  void rope(int stream, int rows, int heads, int head_dim, std::int64_t position_offset, float base, bool inverse, bf16_bits* x) override {
    kernels::rope(rows, heads, head_dim, position_offset, base, inverse, x, streams_.at(stream));
  }
  void cross_entropy_forward(int stream, int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, float* loss,
                             float* lse) override {
    kernels::cross_entropy_forward(rows, vocab, logits, targets, loss, lse, streams_.at(stream));
  }
  void vocab_parallel_merge(int stream, int rows, int shards, const float* stats, float* loss, float* lse) override {
    kernels::vocab_parallel_merge(rows, shards, stats, loss, lse, streams_.at(stream));
  }
  void cross_entropy_backward(int stream, int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, const float* lse,
                              const float* dloss, bf16_bits* dlogits) override {
    kernels::cross_entropy_backward(rows, vocab, logits, targets, lse, dloss, dlogits, streams_.at(stream));
  }
  void adamw(int stream, const kernels::AdamW& opt, int step, std::int64_t n, float* master, float* m, float* v, const float* grad,
             bf16_bits* weights) override {
    kernels::adamw(opt, step, n, master, m, v, grad, weights, streams_.at(stream));
  }
  // On the host, in the stream's order (compiled, NOT YET RUN ON A GPU). A host function may not call CUDA: it only
  // computes on pinned memory; an error there is kept and thrown by the next synchronize().
  void host_adamw(int stream, const kernels::AdamW& opt, int step, std::int64_t n, float* master, float* m, float* v, const float* grad,
                  bf16_bits* weights) override {
    auto job = std::make_unique<HostAdamW>(HostAdamW{this, opt, step, n, master, m, v, grad, weights});
    TRAINYARD_CUDA_CHECK(cudaLaunchHostFunc(streams_.at(stream), &HostAdamW::run, job.get()));
    job.release();  // HostAdamW::run owns it now
  }
  // NCCL, bootstrapped through `comm` (NOT YET RUN ON A GPU: nccl_peers.hpp).
  void prepare_peers(Communicator& comm, const std::vector<std::vector<int>>& groups, std::chrono::milliseconds timeout) override {
    peers_ = std::make_unique<NcclPeers>(comm, groups, timeout);
  }
  void all_reduce_sum(int stream, Communicator&, std::vector<int> ranks, float* data, std::int64_t n) override {
    if (!peers_) throw InternalError("an all-reduce before prepare_peers", __FILE__, __LINE__);
    peers_->all_reduce_sum(ranks, data, n, streams_.at(stream));
  }
  void all_reduce_sum(int stream, Communicator&, std::vector<int> ranks, bf16_bits* data, std::int64_t n) override {
    if (!peers_) throw InternalError("an all-reduce before prepare_peers", __FILE__, __LINE__);
    peers_->all_reduce_sum_bf16(ranks, data, n, streams_.at(stream));
  }
  void send(int stream, Communicator&, int peer, int, std::vector<ConstBytes> buffers) override {
    if (!peers_) throw InternalError("a send before prepare_peers", __FILE__, __LINE__);
    for (const ConstBytes& b : buffers) peers_->send(peer, b.data, b.size, streams_.at(stream));
  }
  void recv(int stream, Communicator&, int peer, int, std::vector<Bytes> buffers) override {
    if (!peers_) throw InternalError("a receive before prepare_peers", __FILE__, __LINE__);
    for (const Bytes& b : buffers) peers_->recv(peer, b.data, b.size, streams_.at(stream));
  }
  void all_to_all(int stream, Communicator&, const std::vector<int>& ranks, int, std::vector<ConstBytes> sends, std::vector<Bytes> recvs) override {
    if (!peers_) throw InternalError("an all-to-all before prepare_peers", __FILE__, __LINE__);
    peers_->all_to_all(ranks, sends, recvs, streams_.at(stream));
  }

 private:
  // The current device's default stream-ordered pool, where scratch comes from.
  static cudaMemPool_t pool() {
    int device = 0;
    TRAINYARD_CUDA_CHECK(cudaGetDevice(&device));
    cudaMemPool_t pool = nullptr;
    TRAINYARD_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    return pool;
  }

  std::vector<cudaStream_t> streams_;
  std::vector<std::unique_ptr<kernels::Gemm>> gemms_;  // one per stream: each owns its workspace
  std::vector<cudaEvent_t> events_;
  std::unique_ptr<NcclPeers> peers_;  // several ranks: the NCCL communicators
  std::mutex host_error_mutex_;
  std::string host_error_;  // the first error a host function met (HostAdamW), thrown by synchronize()
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(int index) {
  if (index >= 0) TRAINYARD_CUDA_CHECK(cudaSetDevice(index));
  return std::make_unique<CudaDevice>();
}

}  // namespace trainyard::backend
