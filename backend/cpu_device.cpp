#include "backend/cpu_device.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/interrupt.hpp"

namespace trainyard::backend {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kAlignment = 256;  // as cudaMalloc's (and the arenas') alignment

// bf16 storage as the references' float values, and back (rounded to nearest even, as the CUDA kernels store).
std::vector<float> widen(const bf16_bits* p, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = kernels::from_bf16(p[i]);
  return out;
}
void narrow(std::span<const float> x, bf16_bits* out) {
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = kernels::to_bf16(x[i]);
}
// The next message from `peer` under `tag`, into `buffers` one after another: an error naming both ranks unless
// it is exactly their size (the ranks disagree on the plan).
void receive_into(Communicator& comm, int peer, int tag, std::span<const Bytes> buffers) {
  const std::vector<std::byte> message = comm.recv(peer, tag);
  std::int64_t expected = 0;
  for (const Bytes& b : buffers) expected += b.size;
  if (static_cast<std::int64_t>(message.size()) != expected) {
    throw TRAINYARD_COMM_ERROR("rank " + std::to_string(comm.rank()) + ": a message of " + std::to_string(message.size()) + " bytes from rank " +
                               std::to_string(peer) + " (tag " + std::to_string(tag) + ") where the plan has " + std::to_string(expected));
  }
  std::int64_t at = 0;
  for (const Bytes& b : buffers) {
    std::memcpy(b.data, message.data() + at, static_cast<std::size_t>(b.size));
    at += b.size;
  }
}

template <typename T>
std::span<T> span_of(T* p, std::int64_t n) {
  return {p, static_cast<std::size_t>(n)};
}

// The references index an embedding table by token id: its elements up to the largest id's row.
std::int64_t table_elements_used(std::span<const std::int32_t> ids, int hidden) {
  return (ids.empty() ? 0 : *std::max_element(ids.begin(), ids.end()) + 1) * static_cast<std::int64_t>(hidden);
}

struct CpuStream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool running = false, stop = false;
  std::thread thread;
};

struct CpuEvent {
  std::uint64_t queued = 0;  // records queued so far (the host thread's count)
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t done = 0;  // records completed
  Clock::time_point at;    // when the latest completed
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& options) : options_(options) {
    if (options_.memory_bytes <= 0) {
      options_.memory_bytes = static_cast<std::int64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
    }
  }
  ~CpuDevice() override {
    for (auto& s : streams_) {
      {
        std::lock_guard lock(s->mu);
        s->stop = true;
      }
      s->cv.notify_all();
    }
    for (auto& s : streams_) s->thread.join();
    for (const auto& [p, bytes] : allocations_) ::operator delete (p, std::align_val_t{kAlignment});
  }

  std::string name() const override { return "cpu (" + std::to_string(streams_.size()) + " streams as threads)"; }
  std::string refuses_head_dim(std::int64_t) const override { return ""; }

  // --- memory ----------------------------------------------------------------------------------------------
  std::int64_t free_bytes() override { return options_.memory_bytes - used_bytes(); }
  std::int64_t used_bytes() override { return allocated_bytes_.load() + scratch_live_bytes_.load(); }
  void* allocate(std::int64_t bytes) override { return take(bytes); }
  void* allocate_pinned(std::int64_t bytes) override { return take(bytes); }
  void release(void* p) noexcept override { give_back(p); }
  void release_pinned(void* p) noexcept override { give_back(p); }
  void* scratch(int stream, std::int64_t bytes) override {
    (void)stream_at(stream);
    void* p = ::operator new (static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1)), std::align_val_t{kAlignment});
    const std::int64_t live = scratch_live_bytes_ += bytes;
    std::int64_t peak = scratch_peak_bytes_.load();
    while (live > peak && !scratch_peak_bytes_.compare_exchange_weak(peak, live)) {
    }
    std::lock_guard lock(scratch_mu_);
    scratch_sizes_[p] = bytes;
    return p;
  }
  void release_scratch(int stream, void* p) override {
    enqueue(stream, [this, p] {
      std::int64_t bytes = 0;
      {
        std::lock_guard lock(scratch_mu_);
        bytes = scratch_sizes_.at(p);
        scratch_sizes_.erase(p);
      }
      ::operator delete (p, std::align_val_t{kAlignment});
      scratch_live_bytes_ -= bytes;
    });
  }
  void reset_scratch_peak() override { scratch_peak_bytes_ = scratch_live_bytes_.load(); }
  std::int64_t scratch_peak_bytes() override { return scratch_peak_bytes_.load(); }
  std::int64_t per_stream_bytes() const override { return 0; }

  // --- synchronous ---------------------------------------------------------------------------------------------
  void upload(void* dst, const void* src, std::int64_t bytes) override {
    synchronize();
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));
  }
  void download(void* dst, const void* src, std::int64_t bytes) override {
    synchronize();
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));
  }
  void fill(void* dst, int byte, std::int64_t bytes) override {
    synchronize();
    std::memset(dst, byte, static_cast<std::size_t>(bytes));
  }
  void synchronize() override {
    for (auto& s : streams_) {
      std::unique_lock lock(s->mu);
      s->cv.wait(lock, [&] { return s->queue.empty() && !s->running; });
    }
    std::exception_ptr error;
    {
      std::lock_guard lock(error_mu_);
      std::swap(error, error_);
      failed_ = false;
    }
    if (error) std::rethrow_exception(error);
  }

  // --- streams and events ----------------------------------------------------------------------------------
  int create_stream() override {
    auto s = std::make_unique<CpuStream>();
    CpuStream* raw = s.get();
    raw->thread = std::thread([this, raw] { work(*raw); });
    streams_.push_back(std::move(s));
    return static_cast<int>(streams_.size()) - 1;
  }
  int create_event() override {
    events_.emplace_back();
    return static_cast<int>(events_.size()) - 1;
  }
  void record(int event, int stream) override {
    CpuEvent* e = &event_at(event);
    const std::uint64_t generation = ++e->queued;
    enqueue(stream, [e, generation] {
      {
        std::lock_guard lock(e->mu);
        e->done = generation;
        e->at = Clock::now();
      }
      e->cv.notify_all();
    });
  }
  void wait(int stream, int event) override {
    CpuEvent* e = &event_at(event);
    const std::uint64_t generation = e->queued;
    if (generation == 0) return;  // never recorded: CUDA does not wait either
    enqueue(stream, [this, e, generation, stream, event] { block_until(*e, generation, stream, event); });
  }
  double elapsed_ms(int from, int to) override {
    const Clock::time_point a = completed_at(from), b = completed_at(to);
    return std::chrono::duration<double, std::milli>(b - a).count();
  }
  void copy(int stream, void* dst, const void* src, std::int64_t bytes) override {
    enqueue(stream, [=] { std::memcpy(dst, src, static_cast<std::size_t>(bytes)); });
  }
  void fill(int stream, void* dst, int byte, std::int64_t bytes) override {
    enqueue(stream, [=] { std::memset(dst, byte, static_cast<std::size_t>(bytes)); });
  }
  void copy_2d(int stream, void* dst, std::int64_t dst_pitch, const void* src, std::int64_t src_pitch, std::int64_t row_bytes,
               std::int64_t rows) override {
    enqueue(stream, [=] {
      for (std::int64_t r = 0; r < rows; ++r) {
        std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, static_cast<std::size_t>(row_bytes));
      }
    });
  }

  // --- kernels: the references on widened bf16 -----------------------------------------------------------------
  void gemm(int stream, int m, int n, int k, const bf16_bits* a, bool ta, const bf16_bits* b, bool tb, void* c, bool c_fp32, float alpha,
            float beta) override {
    enqueue(stream, [=] {
      const std::int64_t mn = static_cast<std::int64_t>(m) * n;
      const auto af = widen(a, static_cast<std::int64_t>(m) * k), bf = widen(b, static_cast<std::int64_t>(k) * n);
      if (c_fp32) {
        kernels::gemm_ref(m, n, k, af, ta, bf, tb, span_of(static_cast<float*>(c), mn), alpha, beta);
        return;
      }
      auto cf = beta != 0 ? widen(static_cast<const bf16_bits*>(c), mn) : std::vector<float>(static_cast<std::size_t>(mn));
      kernels::gemm_ref(m, n, k, af, ta, bf, tb, cf, alpha, beta);
      narrow(cf, static_cast<bf16_bits*>(c));
    });
  }
  void attention_forward(int stream, const kernels::AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o,
                         float* lse) override {
    enqueue(stream, [=] {
      const std::int64_t qn = static_cast<std::int64_t>(s.q_len) * s.heads * s.head_dim,
                         kvn = static_cast<std::int64_t>(s.kv_len) * s.kv_heads * s.head_dim;
      std::vector<float> of(static_cast<std::size_t>(qn));
      kernels::attention_forward_ref(s, widen(q, qn), widen(k, kvn), widen(v, kvn), of, span_of(lse, static_cast<std::int64_t>(s.heads) * s.q_len));
      narrow(of, o);
    });
  }
  void attention_merge(int stream, int q_len, int heads, int head_dim, float* o_acc, float* lse_acc, const bf16_bits* o_part,
                       const float* lse_part) override {
    enqueue(stream, [=] {
      const std::int64_t n = static_cast<std::int64_t>(q_len) * heads * head_dim, rows = static_cast<std::int64_t>(heads) * q_len;
      kernels::attention_merge_ref(q_len, heads, head_dim, span_of(o_acc, n), span_of(lse_acc, rows), widen(o_part, n), span_of(lse_part, rows));
    });
  }
  void attention_backward_prep(int stream, int q_len, int heads, int head_dim, const bf16_bits* o, const bf16_bits* d_o, float* delta) override {
    enqueue(stream, [=] {
      const std::int64_t n = static_cast<std::int64_t>(q_len) * heads * head_dim;
      kernels::attention_backward_prep_ref(q_len, heads, head_dim, widen(o, n), widen(d_o, n),
                                           span_of(delta, static_cast<std::int64_t>(heads) * q_len));
    });
  }
  void attention_backward(int stream, const kernels::AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                          const bf16_bits* d_o, const float* lse, const float* delta, float* dq, float* dk, float* dv) override {
    enqueue(stream, [=] {
      const std::int64_t qn = static_cast<std::int64_t>(s.q_len) * s.heads * s.head_dim,
                         kvn = static_cast<std::int64_t>(s.kv_len) * s.kv_heads * s.head_dim, rows = static_cast<std::int64_t>(s.heads) * s.q_len;
      kernels::attention_backward_ref(s, widen(q, qn), widen(k, kvn), widen(v, kvn), widen(d_o, qn), span_of(lse, rows), span_of(delta, rows),
                                      span_of(dq, qn), span_of(dk, kvn), span_of(dv, kvn));
    });
  }
  void to_bf16(int stream, const float* x, bf16_bits* y, std::int64_t n) override {
    enqueue(stream, [=] { narrow(span_of(x, n), y); });
  }
  void rmsnorm_forward(int stream, int rows, int cols, float eps, const bf16_bits* x, const bf16_bits* w, bf16_bits* y) override {
    enqueue(stream, [=] {
      const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
      std::vector<float> yf(static_cast<std::size_t>(n));
      kernels::rmsnorm_forward_ref(rows, cols, eps, widen(x, n), widen(w, cols), yf);
      narrow(yf, y);
    });
  }
  void rmsnorm_backward(int stream, int rows, int cols, float eps, const bf16_bits* x, const bf16_bits* w, const bf16_bits* dy, bf16_bits* dx,
                        float* dw) override {
    enqueue(stream, [=] {
      const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
      std::vector<float> dxf(static_cast<std::size_t>(n));
      kernels::rmsnorm_backward_ref(rows, cols, eps, widen(x, n), widen(w, cols), widen(dy, n), dxf, span_of(dw, cols));
      narrow(dxf, dx);
    });
  }
  void swiglu_forward(int stream, std::int64_t n, const bf16_bits* gate, const bf16_bits* up, bf16_bits* y) override {
    enqueue(stream, [=] {
      std::vector<float> yf(static_cast<std::size_t>(n));
      kernels::swiglu_forward_ref(widen(gate, n), widen(up, n), yf);
      narrow(yf, y);
    });
  }
  void swiglu_backward(int stream, std::int64_t n, const bf16_bits* gate, const bf16_bits* up, const bf16_bits* dy, bf16_bits* d_gate,
                       bf16_bits* d_up) override {
    enqueue(stream, [=] {
      std::vector<float> dg(static_cast<std::size_t>(n)), du(static_cast<std::size_t>(n));
      kernels::swiglu_backward_ref(widen(gate, n), widen(up, n), widen(dy, n), dg, du);
      narrow(dg, d_gate);
      narrow(du, d_up);
    });
  }
  void add(int stream, std::int64_t n, const bf16_bits* a, const bf16_bits* b, bf16_bits* y) override {
    enqueue(stream, [=] {
      std::vector<float> yf(static_cast<std::size_t>(n));
      kernels::add_ref(widen(a, n), widen(b, n), yf);
      narrow(yf, y);
    });
  }
  void axpy_f32(int stream, std::int64_t n, float alpha, const float* x, float* y) override {
    enqueue(stream, [=] { kernels::axpy_ref(alpha, span_of(x, n), span_of(y, n)); });
  }
  void embedding_forward(int stream, int rows, int hidden, const bf16_bits* table, const std::int32_t* tokens, bf16_bits* y) override {
    enqueue(stream, [=] {
      const auto ids = span_of(tokens, rows);
      const std::int64_t used = table_elements_used(ids, hidden);
      std::vector<float> yf(static_cast<std::size_t>(rows) * static_cast<std::size_t>(hidden));
      kernels::embedding_forward_ref(rows, hidden, widen(table, used), ids, yf);
      narrow(yf, y);
    });
  }
  void embedding_backward(int stream, int rows, int hidden, const std::int32_t* tokens, const bf16_bits* dy, float* dtable) override {
    enqueue(stream, [=] {
      const auto ids = span_of(tokens, rows);
      const std::int64_t used = table_elements_used(ids, hidden);
      kernels::embedding_backward_ref(rows, hidden, ids, widen(dy, static_cast<std::int64_t>(rows) * hidden), span_of(dtable, used));
    });
  }
  void rope(int stream, int rows, int heads, int head_dim, std::int64_t position_offset, float base, bool inverse, bf16_bits* x) override {
    enqueue(stream, [=] {
      auto xf = widen(x, static_cast<std::int64_t>(rows) * heads * head_dim);
      kernels::rope_ref(rows, heads, head_dim, position_offset, base, inverse, xf);
      narrow(xf, x);
    });
  }
  void cross_entropy_forward(int stream, int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, float* loss,
                             float* lse) override {
    enqueue(stream, [=] {
      kernels::cross_entropy_forward_ref(rows, vocab, widen(logits, static_cast<std::int64_t>(rows) * vocab), span_of(targets, rows),
                                         span_of(loss, rows), span_of(lse, rows));
    });
  }
  void vocab_parallel_merge(int stream, int rows, int shards, const float* stats, float* loss, float* lse) override {
    enqueue(stream, [=] {
      kernels::vocab_parallel_merge_ref(rows, shards, span_of(stats, 2 * static_cast<std::int64_t>(rows) * shards), span_of(loss, rows),
                                        span_of(lse, rows));
    });
  }
  void cross_entropy_backward(int stream, int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, const float* lse,
                              const float* dloss, bf16_bits* dlogits) override {
    enqueue(stream, [=] {
      const std::int64_t n = static_cast<std::int64_t>(rows) * vocab;
      std::vector<float> d(static_cast<std::size_t>(n));
      kernels::cross_entropy_backward_ref(rows, vocab, widen(logits, n), span_of(targets, rows), span_of(lse, rows), span_of(dloss, rows), d);
      narrow(d, dlogits);
    });
  }
  void prepare_peers(Communicator&, const std::vector<std::vector<int>>&, std::chrono::milliseconds) override {}  // comm's own groups
  // On the stream's thread. Several streams may call MPI at once (a send, a receive, a reduction): MpiCommunicator
  // makes the calls one at a time (MPI_THREAD_SERIALIZED, what MpiSession asks for). A group's collectives come
  // from one stream (the graph puts a group's reductions on one comm stream), so every rank starts them in one order.
  void all_reduce_sum(int stream, Communicator& comm, std::vector<int> ranks, float* data, std::int64_t n) override {
    enqueue(stream, [&comm, ranks = std::move(ranks), data, n] { comm.all_reduce_sum(ranks, span_of(data, n)); });
  }
  void all_reduce_sum(int stream, Communicator& comm, std::vector<int> ranks, bf16_bits* data, std::int64_t n) override {
    enqueue(stream, [&comm, ranks = std::move(ranks), data, n] {
      std::vector<float> values = widen(data, n);
      comm.all_reduce_sum(ranks, std::span<float>(values));
      narrow(values, data);
    });
  }
  // One MPI message per send: the buffers one after another.
  void send(int stream, Communicator& comm, int peer, int tag, std::vector<ConstBytes> buffers) override {
    enqueue(stream, [&comm, peer, tag, buffers = std::move(buffers)] {
      std::vector<std::byte> message;
      for (const ConstBytes& b : buffers) {
        const auto* p = static_cast<const std::byte*>(b.data);
        message.insert(message.end(), p, p + b.size);
      }
      comm.send(peer, tag, message);
    });
  }
  void recv(int stream, Communicator& comm, int peer, int tag, std::vector<Bytes> buffers) override {
    enqueue(stream, [&comm, peer, tag, buffers = std::move(buffers)] { receive_into(comm, peer, tag, buffers); });
  }
  void all_to_all(int stream, Communicator& comm, const std::vector<int>& ranks, int tag, std::vector<ConstBytes> sends,
                  std::vector<Bytes> recvs) override {
    TRAINYARD_CHECK(sends.size() == ranks.size() && recvs.size() == ranks.size(), "one block to and from each rank");
    enqueue(stream, [&comm, ranks, tag, sends = std::move(sends), recvs = std::move(recvs)] {
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        const auto* p = static_cast<const std::byte*>(sends[i].data);
        if (ranks[i] == comm.rank()) {
          if (sends[i].size > 0) std::memcpy(recvs[i].data, p, static_cast<std::size_t>(sends[i].size));  // none: already in place
        } else {
          comm.send(ranks[i], tag, std::span(p, static_cast<std::size_t>(sends[i].size)));
        }
      }
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        if (ranks[i] != comm.rank()) receive_into(comm, ranks[i], tag, std::span(&recvs[i], 1));
      }
    });
  }
  // The device's memory is the host's: the host's step on its stream, spread over the cores as on a GPU's host.
  void host_adamw(int stream, const kernels::AdamW& opt, int step, std::int64_t n, float* master, float* m, float* v, const float* grad,
                  bf16_bits* weights) override {
    enqueue(stream, [=] { kernels::adamw_host(opt, step, n, master, m, v, grad, weights); });
  }
  void adamw(int stream, const kernels::AdamW& opt, int step, std::int64_t n, float* master, float* m, float* v, const float* grad,
             bf16_bits* weights) override {
    enqueue(stream, [=] { kernels::adamw_host(opt, step, n, master, m, v, grad, weights, 1); });  // the stream's thread alone
  }

 private:
  CpuStream& stream_at(int stream) {
    TRAINYARD_CHECK(stream >= 0 && stream < static_cast<int>(streams_.size()), "a stream this device created");
    return *streams_[static_cast<std::size_t>(stream)];
  }
  CpuEvent& event_at(int event) {
    TRAINYARD_CHECK(event >= 0 && event < static_cast<int>(events_.size()), "an event this device created");
    return events_[static_cast<std::size_t>(event)];
  }

  void enqueue(int stream, std::function<void()> job) {
    CpuStream& s = stream_at(stream);
    {
      std::lock_guard lock(s.mu);
      s.queue.push_back(std::move(job));
    }
    s.cv.notify_all();
  }

  // A stream's thread: runs its queue in order; after a failure anywhere, drops what is queued.
  void work(CpuStream& s) {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(s.mu);
        s.cv.wait(lock, [&] { return s.stop || !s.queue.empty(); });
        if (s.queue.empty()) return;
        job = std::move(s.queue.front());
        s.queue.pop_front();
        s.running = true;
      }
      if (!failed_.load()) {
        try {
          job();
        } catch (...) {
          fail(std::current_exception());
        }
      }
      {
        std::lock_guard lock(s.mu);
        s.running = false;
      }
      s.cv.notify_all();
    }
  }

  void fail(std::exception_ptr error) {
    std::lock_guard lock(error_mu_);
    if (!error_) error_ = error;
    failed_ = true;
  }

  void block_until(CpuEvent& e, std::uint64_t generation, int stream, int event) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.wait_timeout_s));
    std::unique_lock lock(e.mu);
    while (e.done < generation) {
      if (failed_.load()) return;  // the step is lost already; the first error is the one to report
      if (interrupted()) throw Interrupted();
      if (Clock::now() >= deadline) {
        throw InternalError("cpu device: stream " + std::to_string(stream) + " waited more than " + std::to_string(options_.wait_timeout_s) +
                                " s for event " + std::to_string(event) + " (recorded but never reached: its stream is stuck or was never run)",
                            __FILE__, __LINE__);
      }
      e.cv.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  Clock::time_point completed_at(int event) {
    CpuEvent& e = event_at(event);
    std::lock_guard lock(e.mu);
    TRAINYARD_CHECK(e.done > 0 && e.done == e.queued, "an event recorded and complete");
    return e.at;
  }

  void* take(std::int64_t bytes) {
    const std::int64_t size = std::max<std::int64_t>(bytes, 1);
    if (size > free_bytes()) {
      throw InputError("the cpu device", "memory", "at most " + std::to_string(free_bytes()) + " bytes more", std::to_string(size) + " bytes");
    }
    void* p = ::operator new (static_cast<std::size_t>(size), std::align_val_t{kAlignment});
    std::lock_guard lock(alloc_mu_);
    allocations_[p] = size;
    allocated_bytes_ += size;
    return p;
  }
  void give_back(void* p) noexcept {
    if (p == nullptr) return;
    std::lock_guard lock(alloc_mu_);
    const auto it = allocations_.find(p);
    if (it == allocations_.end()) return;
    allocated_bytes_ -= it->second;
    allocations_.erase(it);
    ::operator delete (p, std::align_val_t{kAlignment});
  }

  CpuDeviceOptions options_;
  std::vector<std::unique_ptr<CpuStream>> streams_;
  std::deque<CpuEvent> events_;  // a deque: elements never move, so queued work may hold their addresses
  std::mutex error_mu_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
  std::mutex alloc_mu_;
  std::map<void*, std::int64_t> allocations_;
  std::atomic<std::int64_t> allocated_bytes_{0};
  std::mutex scratch_mu_;
  std::map<void*, std::int64_t> scratch_sizes_;
  std::atomic<std::int64_t> scratch_live_bytes_{0}, scratch_peak_bytes_{0};
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& options) { return std::make_unique<CpuDevice>(options); }

}  // namespace trainyard::backend
