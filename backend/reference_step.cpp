#include "backend/reference_step.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "backend/parameter_groups.hpp"
#include "common/error.hpp"

namespace trainyard::backend {

namespace {

// A tensor's copy at one place.
struct Slot {
  std::vector<float> data;
  std::int64_t version = 0;
  sim::TaskId producer = -1;
  std::vector<sim::TaskId> readers;  // since the last write
};

// The parameter groups, with what wrote their gradients (for the optimizer's order check).
struct GroupState {
  std::set<sim::DeviceId> owners;
  std::vector<sim::TaskId> grad_writers;
  // Per GPU, the last reduction of the group it was a member of: a writer there after it adds to what it summed,
  // in place, so it must wait for it.
  std::map<sim::DeviceId, sim::TaskId> last_reduction;
  bool updated = false;
};

class ReferenceStep {
 public:
  ReferenceStep(const sim::TaskGraph& graph, ModelState& state, int gpus_per_node, std::span<const std::vector<std::int32_t>> tokens,
                const ReferenceOptions& options)
      : g_(graph),
        s_(state),
        m_(state.model()),
        c_(graph.chunk_tokens()),
        gpn_(gpus_per_node),
        tokens_(tokens),
        opt_(options),
        comm_(options.comm != nullptr && options.comm->size() > 1 ? options.comm : nullptr) {
    TRAINYARD_CHECK(!tokens.empty(), "a step has at least one sequence");
    seq_len_ = static_cast<std::int64_t>(tokens.front().size()) - 1;
    total_tokens_ = seq_len_ * static_cast<std::int64_t>(tokens.size());
  }

  ReferenceResult run() {
    const auto order = stream_ordered_order(g_, &preds_);
    check_annotated();
    if (c_ <= 0 || seq_len_ % c_ != 0) {
      throw InputError("the step's tokens", "sequence length", "a multiple of the graph's chunk length (" + std::to_string(c_) + " tokens)",
                       std::to_string(seq_len_));
    }
    if (static_cast<std::int64_t>(g_.size()) <= opt_.race_check_max_tasks) build_ancestors(order);
    find_owners();
    if (comm_) {
      check_ranks();
      std::vector<std::vector<int>> groups = reduction_groups(g_);
      groups.push_back(all_ranks());                                              // the loss's sum
      for (sim::TaskId id = 0; id < static_cast<sim::TaskId>(g_.size()); ++id) {  // Ulysses' all-to-alls
        const sim::Task& t = g_.task(id);
        if (t.kind() != sim::TaskKind::collective || !is_heads_exchange(t.op.code)) continue;
        const auto& members = g_.groups()[std::get<sim::Collective>(t.params).group];
        if (std::find(groups.begin(), groups.end(), std::vector<int>(members.begin(), members.end())) == groups.end())
          groups.emplace_back(members.begin(), members.end());
      }
      comm_->prepare_groups(groups);
    }
    s_.zero_grads();
    for (sim::TaskId id : order) run_task(id);
    if (comm_) {  // every rank's share of the loss
      double sums[2] = {loss_sum_, static_cast<double>(loss_rows_)};
      comm_->all_reduce_sum(all_ranks(), sums);
      loss_sum_ = sums[0];
      loss_rows_ = static_cast<std::int64_t>(std::llround(sums[1]));
    }
    if (loss_rows_ != total_tokens_) {
      throw InputError("the step's tokens", "sequences", std::to_string(loss_rows_ / seq_len_) + " (the graph's sequences)",
                       std::to_string(tokens_.size()));
    }
    for (const auto& [group, state] : groups_) {
      if (!comm_ || state.owners.count(comm_->rank())) {
        TRAINYARD_CHECK(state.updated || !has_optimizer_, "every parameter group has an optimizer step");
      }
    }
    ReferenceResult r;
    r.loss = loss_sum_ / static_cast<double>(total_tokens_);
    r.tokens = total_tokens_;
    r.tasks_run = static_cast<std::int64_t>(order.size());
    r.reads_checked = reads_checked_;
    r.race_checked = !ancestors_.empty();
    return r;
  }

 private:
  // --- graph order ---------------------------------------------------------------------------------------------
  void build_ancestors(const std::vector<sim::TaskId>& order) {
    const std::size_t n = g_.size(), words = (n + 63) / 64;
    ancestors_.assign(n, std::vector<std::uint64_t>(words, 0));
    for (sim::TaskId t : order) {
      auto& mine = ancestors_[t];
      for (sim::TaskId p : preds_[t]) {
        const auto& theirs = ancestors_[p];
        for (std::size_t w = 0; w < words; ++w) mine[w] |= theirs[w];
        mine[static_cast<std::size_t>(p) / 64] |= std::uint64_t{1} << (static_cast<std::size_t>(p) % 64);
      }
    }
  }

  // True when `before` is `task` or must finish before it starts (or when the check is off).
  bool ordered(sim::TaskId before, sim::TaskId task) const {
    if (ancestors_.empty() || before == task) return true;
    const auto b = static_cast<std::size_t>(before);
    return (ancestors_[task][b / 64] >> (b % 64)) & 1;
  }

  std::string name(sim::TaskId id) const { return "task " + std::to_string(id) + " '" + std::string(g_.name(id)) + "'"; }
  [[noreturn]] void fail(sim::TaskId id, const std::string& what) const { throw InternalError(name(id) + ": " + what, __FILE__, __LINE__); }

  void check_annotated() const {
    if (g_.tensor_shards() != 1) {  // the reference holds whole tensors; the executor runs the shards
      throw InputError("the plan's task graph", "tensor parallelism",
                       "none for the CPU reference (run a TP plan on the executor, and compare with the same model's tp 1 plan here)",
                       "tp " + std::to_string(g_.tensor_shards()));
    }
    for (sim::TaskId id = 0; id < static_cast<sim::TaskId>(g_.size()); ++id) {
      const auto& t = g_.task(id);
      if (t.kind() == sim::TaskKind::free) continue;  // a free drops what its allocation holds
      if (t.op.code == sim::OpCode::cp_gather_kv || t.op.code == sim::OpCode::cp_scatter_dkv) {
        throw InputError("the plan's task graph", name(id),
                         "no all-gather context parallelism for the CPU reference (the executor runs it; compare with the same model's cp 1 "
                         "plan here)",
                         "an all-gather of K/V or a reduce-scatter of dK|dV");
      }
      if (t.op.code == sim::OpCode::none && t.kind() != sim::TaskKind::alloc) {
        throw InputError("the plan's task graph", name(id),
                         "a task the executor can run (a builder that annotates its tasks: ring-track, Megatron, ZeRO)", "a task without an op");
      }
    }
  }

  // Which GPUs hold each parameter group: where its forward runs.
  void find_owners() {
    for (auto& [group, owners] : forward_owners(g_)) groups_[group].owners = std::move(owners);
  }

  // --- ranks ---------------------------------------------------------------------------------------------------
  bool mine(sim::DeviceId gpu) const { return !comm_ || gpu == comm_->rank(); }
  std::vector<int> all_ranks() const {
    std::vector<int> r(static_cast<std::size_t>(comm_->size()));
    for (int i = 0; i < comm_->size(); ++i) r[static_cast<std::size_t>(i)] = i;
    return r;
  }

  // One rank per GPU, and every parameter group used on several GPUs reduced by some collective of the graph.
  void check_ranks() const {
    int gpus = 0;
    for (const sim::Task& t : g_.tasks()) {
      if (!sim::is_host(t.device)) gpus = std::max(gpus, t.device + 1);
    }
    if (gpus != comm_->size()) {
      throw InputError("mpirun", "ranks (-np)", std::to_string(gpus) + ", one per GPU of the plan (or run without mpirun: one rank)",
                       std::to_string(comm_->size()));
    }
    if (const auto group = unreduced_shared_group(g_, m_)) {
      throw InputError("the plan's task graph", group_name(*group), "a gradient reduction over the GPUs that use it, to run on several ranks",
                       "none");
    }
  }

  // A gradient reduction on this rank: the sum over its members of each carried group's gradients.
  // A group reduced again over the same ranks later in the step (ZeRO-2/3 reduce every micro-batch) already holds
  // the last sum S on every member, to which each added its own new share: the new sum is the members' total minus
  // (n - 1) S. Over other ranks (tied embeddings: the first and last stage after each one's data-parallel sum) the
  // values themselves are summed.
  void reduce_gradients(const sim::Task& t) {
    const std::vector<int> ranks = reduction_ranks(g_, t);
    if (!std::binary_search(ranks.begin(), ranks.end(), comm_->rank())) return;
    const auto others = static_cast<float>(ranks.size() - 1);
    for (int group : carried_groups(t.op)) {
      for (Parameter* p : s_.group(group)) {
        comm_->all_reduce_sum(ranks, p->grad);
        auto [last, first] = last_reduced_.try_emplace({p, ranks});
        if (!first) {
          for (std::size_t i = 0; i < p->grad.size(); ++i) p->grad[i] -= others * last->second[i];
        }
        last->second = p->grad;
      }
    }
  }

  // A send between ranks: the tensors the sender holds of what `op` moves, each with its version, in one message
  // under the task's id.
  void send_tensors(sim::TaskId task, sim::DeviceId from, sim::DeviceId to, const sim::Op& op) {
    std::vector<std::byte> message;
    auto put = [&](const void* data, std::size_t bytes) {
      const auto* b = static_cast<const std::byte*>(data);
      message.insert(message.end(), b, b + bytes);
    };
    const auto keys = content(op);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].role == Role::dkv && !exists(keys[i])) continue;  // an accumulator nothing has added to yet is zero
      const std::vector<float>& data = read(task, from, keys[i]);
      const std::int64_t header[3] = {static_cast<std::int64_t>(i), store_.at({from, keys[i]}).version, static_cast<std::int64_t>(data.size())};
      put(header, sizeof header);
      put(data.data(), data.size() * sizeof(float));
    }
    comm_->send(to, task, message);
  }

  void receive_tensors(sim::TaskId task, sim::DeviceId from, sim::DeviceId to, const sim::Op& op) {
    const std::vector<std::byte> message = comm_->recv(from, task);
    const auto keys = content(op);
    std::vector<bool> received(keys.size(), false);
    std::size_t at = 0;
    while (at < message.size()) {
      std::int64_t header[3];
      if (message.size() - at < sizeof header) fail(task, "a message from rank " + std::to_string(from) + " cut short");
      std::memcpy(header, message.data() + at, sizeof header);
      at += sizeof header;
      const auto bytes = static_cast<std::size_t>(header[2]) * sizeof(float);
      if (header[0] < 0 || header[0] >= static_cast<std::int64_t>(keys.size()) || header[2] < 0 || message.size() - at < bytes) {
        fail(task, "a message from rank " + std::to_string(from) + " that does not match the task's tensors");
      }
      std::vector<float> data(static_cast<std::size_t>(header[2]));
      std::memcpy(data.data(), message.data() + at, bytes);
      at += bytes;
      received[static_cast<std::size_t>(header[0])] = true;
      const Key key = arrival(op, keys[static_cast<std::size_t>(header[0])]);
      latest_[key] = std::max(latest_[key], header[1]);
      write(task, to, key, std::move(data), header[1]);
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!received[i]) zeros_for_nothing_added(task, to, op, keys[i]);
    }
  }

  // A ring's dK | dV accumulator that nothing added to (zigzag: a rank that computed on one of a block's two
  // chunks) arrives as zeros where it is added in; elsewhere an absent accumulator is simply zero.
  void zeros_for_nothing_added(sim::TaskId task, sim::DeviceId to, const sim::Op& op, const Key& key) {
    const Key delivered = arrival(op, key);
    if (delivered.role != Role::dkv_in) return;
    write(task, to, delivered, std::vector<float>(static_cast<std::size_t>(chunk_tensor(delivered.role, model_of(op, m_), c_).elements), 0.0f));
  }

  // --- tensors and the dataflow checks ----------------------------------------------------------------------------
  sim::DeviceId host_of(sim::DeviceId gpu) const { return sim::host_device(gpu / gpn_); }

  const std::vector<float>& read(sim::TaskId task, sim::DeviceId where, const Key& key) {
    auto it = store_.find({where, key});
    if (it == store_.end()) {
      fail(task, "reads " + describe(key) + " on " + sim::device_name(where) + ", which does not hold it (" +
                     (latest_.count(key) ? "it is elsewhere: the plan lacks a copy or freed it too early" : "nothing has produced it") + ")");
    }
    Slot& slot = it->second;
    if (slot.version != latest_[key]) {
      fail(task, "reads " + describe(key) + " on " + sim::device_name(where) + " at version " + std::to_string(slot.version) + " but the latest is " +
                     std::to_string(latest_[key]) + ": a stale copy");
    }
    if (!ordered(slot.producer, task)) {
      fail(task, "reads " + describe(key) + " on " + sim::device_name(where) + " put there by " + name(slot.producer) +
                     ", which is not ordered before it: a race");
    }
    slot.readers.push_back(task);
    ++reads_checked_;
    if (opt_.record) opt_.record->push_back({task, where, key, false});
    return slot.data;
  }

  bool exists(const Key& key) const { return latest_.count(key) > 0; }
  float eps() const { return static_cast<float>(m_.norm_epsilon); }
  float rope_theta() const { return static_cast<float>(m_.rope_theta.value_or(0)); }  // ModelState refuses a model without one

  // The compute task being run, its tensors found by name through the op table (ops.hpp): a tensor its entry
  // does not name fails at once.
  struct Current {
    sim::TaskId id = -1;
    sim::DeviceId gpu = 0;
    std::vector<Use> uses;
  };
  const std::vector<float>& in(Role role, int kv_chunk = -1) { return read(current_.id, current_.gpu, named_->use(role, kv_chunk).key); }
  void out(Role role, std::vector<float> data, int kv_chunk = -1) {
    write(current_.id, current_.gpu, named_->use(role, kv_chunk, true).key, std::move(data));
  }

  // A new value of `key` at `where` (a new version unless `version` carries a copy's).
  std::vector<float>& write(sim::TaskId task, sim::DeviceId where, const Key& key, std::vector<float> data, std::int64_t version = 0) {
    Slot& slot = store_[{where, key}];
    if (slot.producer >= 0 && !ordered(slot.producer, task)) {
      fail(task, "overwrites " + describe(key) + " on " + sim::device_name(where) + " written by " + name(slot.producer) +
                     ", which is not ordered before it: a race");
    }
    for (sim::TaskId r : slot.readers) {
      if (!ordered(r, task))
        fail(task, "overwrites " + describe(key) + " on " + sim::device_name(where) + " while " + name(r) + " may still read it");
    }
    if (opt_.record) opt_.record->push_back({task, where, key, true});
    slot.data = std::move(data);
    slot.version = version > 0 ? version : ++latest_[key];
    slot.producer = task;
    slot.readers.clear();
    return slot.data;
  }

  void drop(sim::TaskId task, sim::DeviceId where, const Key& key) {
    auto it = store_.find({where, key});
    if (it == store_.end()) return;
    for (sim::TaskId r : it->second.readers) {
      if (!ordered(r, task)) fail(task, "frees " + describe(key) + " on " + sim::device_name(where) + " while " + name(r) + " may still read it");
    }
    if (!ordered(it->second.producer, task)) {
      fail(task, "frees " + describe(key) + " on " + sim::device_name(where) + " before " + name(it->second.producer) + " wrote it");
    }
    store_.erase(it);
  }

  // Moves the tensors of `op` from one place to another (a copy keeps the version).
  void move(sim::TaskId task, sim::DeviceId from, sim::DeviceId to, const sim::Op& op) {
    const auto keys = content(op);
    if (keys.empty()) fail(task, "moves nothing the executor knows (op " + std::string(sim::to_string(op.code)) + ")");
    for (const Key& key : keys) {
      if (key.role == Role::dkv && !exists(key)) {  // an accumulator nothing has added to yet is zero
        zeros_for_nothing_added(task, to, op, key);
        continue;
      }
      std::vector<float> data = read(task, from, key);
      const std::int64_t version = store_.at({from, key}).version;
      const Key delivered = arrival(op, key);
      if (delivered != key) latest_[delivered] = std::max(latest_[delivered], version);
      write(task, to, delivered, std::move(data), version);
    }
  }

  // --- numerics ------------------------------------------------------------------------------------------------
  void round(std::vector<float>& x) const {
    if (!opt_.emulate_bf16) return;
    for (float& v : x) v = kernels::round_bf16(v);
  }
  std::vector<float> rounded(std::vector<float> x) const {
    round(x);
    return x;
  }

  // y[rows][out] = x[rows][in] W^T, W [out][in].
  static std::vector<float> linear(const std::vector<float>& x, const std::vector<float>& w, std::int64_t rows, std::int64_t in, std::int64_t out) {
    std::vector<float> y(static_cast<std::size_t>(rows * out));
    kernels::gemm_ref(static_cast<int>(rows), static_cast<int>(out), static_cast<int>(in), x, false, w, true, y, 1, 0);
    return y;
  }
  // dx[rows][in] = dy[rows][out] W.
  static std::vector<float> linear_dgrad(const std::vector<float>& dy, const std::vector<float>& w, std::int64_t rows, std::int64_t in,
                                         std::int64_t out) {
    std::vector<float> dx(static_cast<std::size_t>(rows * in));
    kernels::gemm_ref(static_cast<int>(rows), static_cast<int>(in), static_cast<int>(out), dy, false, w, false, dx, 1, 0);
    return dx;
  }
  // dW[out][in] += dy^T x.
  static void linear_wgrad(const std::vector<float>& dy, const std::vector<float>& x, std::vector<float>& dw, std::int64_t rows, std::int64_t in,
                           std::int64_t out) {
    kernels::gemm_ref(static_cast<int>(out), static_cast<int>(in), static_cast<int>(rows), dy, true, x, false, dw, 1, 1);
  }

  void expect_gemm(sim::TaskId id, std::int64_t m, std::int64_t n, std::int64_t k) const {
    const auto* gemm = std::get_if<sim::Gemm>(&g_.task(id).params);
    if (!gemm) fail(id, "expected a GEMM task for op " + std::string(sim::to_string(g_.task(id).op.code)));
    if (gemm->m != m || gemm->n != n || gemm->k != k) {
      fail(id, "the graph's GEMM is " + std::to_string(gemm->m) + " x " + std::to_string(gemm->n) + " x " + std::to_string(gemm->k) +
                   " but the layer runs " + std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k));
    }
  }

  void grad_written(int group, sim::TaskId id) {
    GroupState& state = groups_[group];
    const auto reduced = state.last_reduction.find(g_.task(id).device);
    if (reduced != state.last_reduction.end() && !ordered(reduced->second, id)) {
      fail(id, "adds to gradients that " + name(reduced->second) + " may still be reducing: a race");
    }
    state.grad_writers.push_back(id);
  }

  std::int32_t token(int seq, std::int64_t position) const {
    const auto& t = tokens_[seq];
    TRAINYARD_CHECK(position >= 0 && position < static_cast<std::int64_t>(t.size()), "token position inside the sequence");
    const std::int32_t id = t[position];
    TRAINYARD_CHECK(id >= 0 && id < m_.vocab, "token id inside the vocabulary");
    return id;
  }

  kernels::AttentionShape attention_shape(const sim::Op& op) const {
    kernels::AttentionShape s;
    s.q_len = static_cast<int>(c_);
    s.kv_len = static_cast<int>(c_ * (op.kv_last - op.kv_first + 1));
    s.heads = static_cast<int>(m_.heads / std::max<int>(1, op.head_groups));
    s.kv_heads = static_cast<int>(m_.kv_heads / std::max<int>(1, op.head_groups));
    s.head_dim = static_cast<int>(m_.head_dim);
    s.causal = true;  // with absolute offsets: earlier chunks are wholly visible
    s.q_offset = op.chunk * c_;
    s.kv_offset = op.kv_first * c_;
    return s;
  }

  void expect_attention(sim::TaskId id, const sim::Op& op) const {
    const auto* a = std::get_if<sim::Attention>(&g_.task(id).params);
    if (!a) fail(id, "expected an attention task");
    const auto s = attention_shape(op);
    const bool lengths_differ = expanded_task_tokens_ < 0 && (a->q_len != s.q_len || a->kv_len != s.kv_len);  // see expect_pairs
    const int sequences = g_.task(id).op.seq_count;  // the graph folds a micro-batch's sequences into its heads
    if (lengths_differ || a->heads != s.heads * sequences || a->kv_heads != s.kv_heads * sequences || a->head_dim != s.head_dim) {
      fail(id, "the graph's attention is " + std::to_string(a->q_len) + " queries x " + std::to_string(a->kv_len) + " keys but the op covers " +
                   std::to_string(s.q_len) + " x " + std::to_string(s.kv_len));
    }
    if (op.kv_first < 0 || op.kv_last < op.kv_first || op.kv_last > op.chunk) fail(id, "attends to chunks outside 0..its own");
  }

  // K and V of chunks kv_first..kv_last of a layer, one after another.
  std::pair<std::vector<float>, std::vector<float>> gather_kv(const sim::Op& op) {
    std::vector<float> k, v;
    for (int j = op.kv_first; j <= op.kv_last; ++j) {
      const auto& kj = in(Role::k, j);
      k.insert(k.end(), kj.begin(), kj.end());
      const auto& vj = in(Role::v, j);
      v.insert(v.end(), vj.begin(), vj.end());
    }
    return {std::move(k), std::move(v)};
  }

  void run_task(sim::TaskId id) {
    const sim::Task& t = g_.task(id);
    const sim::Op& op = t.op;
    switch (t.kind()) {
      case sim::TaskKind::alloc: return;  // what it holds matters when it is freed
      case sim::TaskKind::free: {
        const auto alloc_id = std::get<sim::Free>(t.params).alloc;
        const sim::Task& alloc = g_.task(alloc_id);
        for (const Key& key : content(alloc.op)) drop(id, alloc.device, key);
        return;
      }
      case sim::TaskKind::copy: {
        // FPDT's streamed buffers stay where they are (sim::OpCode::fpdt_buffers): the copy moves no values.
        if (op.code == sim::OpCode::states || op.code == sim::OpCode::fpdt_buffers || !mine(t.device)) return;
        const auto& copy = std::get<sim::Copy>(t.params);
        const bool h2d = copy.direction == sim::Copy::Direction::h2d;
        move(id, h2d ? host_of(t.device) : t.device, h2d ? t.device : host_of(t.device), op);
        return;
      }
      case sim::TaskKind::p2p: {
        if (op.code == sim::OpCode::states) return;
        const sim::DeviceId dst = std::get<sim::PointToPoint>(t.params).dst;
        if (mine(t.device) && mine(dst)) {
          move(id, t.device, dst, op);
        } else if (mine(t.device)) {
          send_tensors(id, t.device, dst, op);
        } else if (mine(dst)) {
          receive_tensors(id, t.device, dst, op);
        }
        return;
      }
      case sim::TaskKind::collective:
        if (is_heads_exchange(op.code)) return exchange_heads(id, t);
        if (op.code != sim::OpCode::states)
          fail(id, "a collective on activations: the reference runs gradient reductions and Ulysses' all-to-alls only");
        // One rank: gradients are held once per step, so the all-reduce's sum is already there. Several: a
        // reduction (a reduce-scatter for the distributed optimizer too) sums whole gradients on every member,
        // each member then updates whole weights, and the weights' all-gather (model states) has nothing to move:
        // the same arithmetic as updating shards and gathering them.
        if (op.carries_gradients()) check_reduction_order(id);
        if (comm_ && op.carries_gradients()) reduce_gradients(t);
        return;
      default: break;
    }
    if (op.code == sim::OpCode::states || op.code == sim::OpCode::host_grad_sum) return;  // gradients are held once, wherever
    if (op.code == sim::OpCode::optimizer) {
      if (!mine(op.owner_gpu)) return;
      has_optimizer_ = true;
      return optimizer(id, op);
    }
    if (sim::is_host(t.device)) fail(id, "a host task the executor does not know");
    if (!mine(t.device)) return;
    const std::vector<sim::Op> ops = chunk_ops(op, c_);
    if (ops.size() == 1) return compute(id, t.device, ops.front());  // a piece of a zigzag or run rebased into its chunk
    // A zigzag, run (FPDT), micro-batch or Ulysses op, one chunk (pair) at a time; a GEMM's task spans all its chunks' rows.
    const bool head = op.code >= sim::OpCode::head_logits && op.code <= sim::OpCode::head_wgrad;
    expanded_task_tokens_ = head ? op.row_end - op.row_begin : static_cast<std::int64_t>(covered_chunks(op).size()) * c_ * op.seq_count;
    if (op.code == sim::OpCode::attn || op.code == sim::OpCode::attn_bwd) expect_pairs(id, ops);
    for (const sim::Op& one : ops) compute(id, t.device, one);
    expanded_task_tokens_ = -1;
  }
  // An attention task run as chunk pairs costs as many (query, key) pairs as they compute (a diagonal pair half of
  // its square): zigzag, the graph's causal square of both chunks at the ring's first step, two chunks by one
  // after; Ulysses, the causal square of the whole sequence.
  void expect_pairs(sim::TaskId id, const std::vector<sim::Op>& ops) const {
    const auto* a = std::get_if<sim::Attention>(&g_.task(id).params);
    if (!a) fail(id, "expected an attention task");
    const double graph_pairs = static_cast<double>(a->q_len) * static_cast<double>(a->kv_len) * (a->causal ? 0.5 : 1.0);
    double op_pairs = 0;
    for (const sim::Op& one : ops) op_pairs += static_cast<double>(c_ * c_) * (one.kv_first == one.chunk ? 0.5 : 1.0);
    op_pairs /= std::max<int>(1, g_.task(id).op.seq_count);                  // the graph folds a micro-batch's sequences into its heads
    if (std::abs(graph_pairs - op_pairs) > 0.5 * static_cast<double>(c_)) {  // causal diagonals: within a row's half
      fail(id, "the graph's attention covers " + std::to_string(graph_pairs) + " query-key pairs but its chunk pairs " + std::to_string(op_pairs));
    }
  }
  // The token rows of the running task's GEMM: `rows` (the op's), or a zigzag or run task's (all its chunks).
  std::int64_t task_tokens(std::int64_t rows) const { return expanded_task_tokens_ >= 0 ? expanded_task_tokens_ : rows; }

  // --- Ulysses' all-to-alls ----------------------------------------------------------------------------------
  // Head group g's columns of every row and block, out of `all` (to_group) or into it.
  void head_slice(const HeadsExchanged& e, int groups, int g, std::vector<float>& all, std::vector<float>& part, bool to_group) const {
    const std::int64_t width = width_elements(e.row, m_), w = width / groups, rows = c_ * e.blocks;
    if (to_group) part.assign(static_cast<std::size_t>(rows * w), 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
      float* whole = all.data() + r * width + g * w;
      float* piece = part.data() + r * w;
      to_group ? std::copy_n(whole, w, piece) : std::copy_n(piece, w, whole);
    }
  }
  // Member i of the group holds chunk i (and with zigzag its mirror: member_chunks). To head groups (heads_qkv,
  // heads_dout) member g gets head group g of every member's chunks; back (heads_out, heads_dqkv) member i gets
  // every head group of its chunks. Under MPI, one all-to-all over the group per tensor, equal blocks in member order.
  void exchange_heads(sim::TaskId id, const sim::Task& t) {
    const sim::Op& op = t.op;
    const auto& members = g_.groups()[std::get<sim::Collective>(t.params).group];
    if (std::none_of(members.begin(), members.end(), [&](sim::DeviceId d) { return mine(d); })) return;  // another group's
    const int groups = static_cast<int>(members.size());
    if (op.head_groups != groups)
      fail(id, "an all-to-all over " + std::to_string(groups) + " GPUs for " + std::to_string(op.head_groups) + " head groups");
    const bool to_heads = to_head_groups(op.code);
    auto key = [&](Role role, int chunk, int heads) { return Key{role, op.seq, op.layer, chunk, 0, heads}; };
    for (const HeadsExchanged& e : heads_exchanged(op.code)) {
      const auto piece = static_cast<std::size_t>(c_ * e.blocks * width_elements(e.row, m_) / groups);  // one chunk's head group
      // blocks[from][to]: what member `from` sends member `to`, a head group of each chunk in turn
      std::vector<std::vector<std::vector<float>>> blocks(static_cast<std::size_t>(groups),
                                                          std::vector<std::vector<float>>(static_cast<std::size_t>(groups)));
      for (int from = 0; from < groups; ++from) {
        if (!mine(members[from])) continue;
        for (int to = 0; to < groups; ++to) {
          std::vector<float>& out = blocks[from][to];
          for (std::int32_t chunk : member_chunks(op, to_heads ? from : to)) {
            std::vector<float> part;
            if (to_heads) {
              std::vector<float> whole = read(id, members[from], key(e.role, chunk, 0));
              head_slice(e, groups, to, whole, part, true);
            } else {
              part = read(id, members[from], key(e.role, chunk, from + 1));
            }
            out.insert(out.end(), part.begin(), part.end());
          }
        }
      }
      if (comm_) all_to_all_blocks(members, blocks);
      for (int to = 0; to < groups; ++to) {
        if (!mine(members[to])) continue;
        if (to_heads) {
          for (int from = 0; from < groups; ++from) {
            std::size_t at = 0;
            for (std::int32_t chunk : member_chunks(op, from)) {
              const auto first = blocks[from][to].begin() + static_cast<std::ptrdiff_t>(at);
              write(id, members[to], key(e.role, chunk, to + 1), std::vector<float>(first, first + static_cast<std::ptrdiff_t>(piece)));
              at += piece;
            }
          }
        } else {
          const std::vector<std::int32_t> chunks = member_chunks(op, to);
          for (std::size_t k = 0; k < chunks.size(); ++k) {
            std::vector<float> whole(static_cast<std::size_t>(groups) * piece);
            for (int from = 0; from < groups; ++from) {
              const auto first = blocks[from][to].begin() + static_cast<std::ptrdiff_t>(k * piece);
              std::vector<float> part(first, first + static_cast<std::ptrdiff_t>(piece));
              head_slice(e, groups, from, whole, part, false);
            }
            write(id, members[to], key(e.role, chunks[k], 0), std::move(whole));
          }
        }
      }
    }
  }
  // Under MPI: this rank's row of `blocks` out, its column in.
  void all_to_all_blocks(const std::vector<sim::DeviceId>& members, std::vector<std::vector<std::vector<float>>>& blocks) {
    const auto me = static_cast<std::size_t>(std::find(members.begin(), members.end(), comm_->rank()) - members.begin());
    std::vector<float> out;
    for (const auto& b : blocks[me]) out.insert(out.end(), b.begin(), b.end());
    const std::vector<int> ranks(members.begin(), members.end());
    const std::vector<float> in = comm_->all_to_all(ranks, out);
    const std::size_t each = in.size() / members.size();
    for (std::size_t from = 0; from < members.size(); ++from) {
      blocks[from][me].assign(in.begin() + static_cast<std::ptrdiff_t>(from * each), in.begin() + static_cast<std::ptrdiff_t>((from + 1) * each));
    }
  }

  // A reduction sums what its groups' gradients hold when it runs: every task that has added to them on its members'
  // GPUs must be ordered before it, or on a device with concurrent streams it reads a sum still being made.
  void check_reduction_order(sim::TaskId id) {
    const sim::Task& t = g_.task(id);
    const auto& members = g_.groups()[std::get<sim::Collective>(t.params).group];
    for (int group : carried_groups(t.op)) {
      GroupState& state = groups_[group];
      for (sim::TaskId w : state.grad_writers) {
        const bool member = std::find(members.begin(), members.end(), g_.task(w).device) != members.end();
        if (member && !ordered(w, id)) fail(id, "reduces gradients that " + name(w) + " may still be adding to: a race");
      }
      for (sim::DeviceId d : members) state.last_reduction[d] = id;
    }
  }

  // Every GPU holding a group updates its copy (data-parallel replicas the same way): each must come after every
  // task that adds to the group's gradients; the one copy held here is updated once.
  void optimizer(sim::TaskId id, const sim::Op& op) {
    for (auto& [group, state] : groups_) {
      if (!state.owners.count(op.owner_gpu)) continue;
      for (sim::TaskId w : state.grad_writers) {
        if (!ordered(w, id)) fail(id, "updates parameters whose gradient " + name(w) + " may still be adding to: a race");
      }
      if (state.updated) continue;
      state.updated = true;
      if (opt_.run_optimizer) s_.adamw_step(group, opt_.adam, opt_.optimizer_step);
    }
  }

  void compute(sim::TaskId id, sim::DeviceId gpu, const sim::Op& op) {
    using sim::OpCode;
    std::optional<model::ModelConfig> group;  // Ulysses' attention: one head group's widths
    if (op.head_groups > 0) group = model_of(op, m_);
    const model::ModelConfig& mm = group ? *group : m_;
    const std::int64_t c = c_, h = m_.hidden, q = mm.q_dim(), kv = mm.kv_dim(), f = m_.ffn_hidden;
    const int H = static_cast<int>(mm.heads), D = static_cast<int>(m_.head_dim);
    current_ = {id, gpu, compute_uses(op, m_, c_)};
    named_.emplace(op, current_.uses);
    if (op.layer < 0 || op.chunk < 0 || op.seq < 0) fail(id, "an op without its coordinates");
    if (op.seq >= static_cast<int>(tokens_.size())) {
      throw InputError("the step's tokens", "sequences", "at least " + std::to_string(op.seq + 1) + " (the graph's sequences)",
                       std::to_string(tokens_.size()));
    }
    if (op.layer > m_.layers || (op.layer == m_.layers) != (op.code >= OpCode::head_logits && op.code <= OpCode::head_wgrad)) {
      fail(id, "layer " + std::to_string(op.layer) + " out of range for op " + std::string(sim::to_string(op.code)));
    }
    LayerParameters* layer = op.layer < m_.layers ? &s_.layers()[op.layer] : nullptr;
    // The layer's four linear maps y = x W^T (W [out][in]): forward (qkv's, which splits its output, is below), the
    // input gradient dx = dy W and the weight gradient dW += dy^T x (each *_wgrad code follows its *_dgrad).
    struct Linear {
      OpCode forward, dgrad;
      Role x, y, dy, dx;
      Parameter LayerParameters::*w;
      std::int64_t in, out;
    };
    const Linear linears[] = {
        {OpCode::qkv, OpCode::qkv_dgrad, Role::n1, Role::q, Role::dqkv, Role::dn1, &LayerParameters::wqkv, h, q + 2 * kv},
        {OpCode::proj, OpCode::proj_dgrad, Role::o, Role::p, Role::dp, Role::d_o, &LayerParameters::wo, q, h},
        {OpCode::mlp_up, OpCode::mlp_up_dgrad, Role::n2, Role::gu, Role::dgu, Role::dn2, &LayerParameters::wup, h, 2 * f},
        {OpCode::mlp_down, OpCode::mlp_down_dgrad, Role::a, Role::mo, Role::dm, Role::da, &LayerParameters::wdown, f, h},
    };
    for (const Linear& l : linears) {
      if (op.code == l.forward && op.code != OpCode::qkv) {
        expect_gemm(id, task_tokens(c), l.out, l.in);
        out(l.y, rounded(linear(in(l.x), (layer->*l.w).weight, c, l.in, l.out)));
        return;
      }
      if (op.code == l.dgrad) {
        expect_gemm(id, task_tokens(c), l.in, l.out);
        out(l.dx, rounded(linear_dgrad(in(l.dy), (layer->*l.w).weight, c, l.in, l.out)));
        return;
      }
      if (op.code == static_cast<OpCode>(static_cast<int>(l.dgrad) + 1)) {
        expect_gemm(id, l.in, l.out, task_tokens(c));
        linear_wgrad(in(l.dy), in(l.x), (layer->*l.w).grad, c, l.in, l.out);
        grad_written(op.layer, id);
        return;
      }
    }
    switch (op.code) {
      // ---- forward -------------------------------------------------------------------------------------------
      case OpCode::embed: {
        std::vector<float> x(static_cast<std::size_t>(c * h));
        const auto& e = s_.embedding().weight;
        for (std::int64_t r = 0; r < c; ++r) {
          const std::int64_t row = token(op.seq, op.chunk * c + r);
          std::copy_n(e.begin() + row * h, h, x.begin() + r * h);
        }
        out(Role::x, std::move(x));
        return;
      }
      case OpCode::norm1:
      case OpCode::norm2: {
        const bool first = op.code == OpCode::norm1;
        const auto& x = in(first ? Role::x : Role::h1);
        std::vector<float> y(x.size());
        kernels::rmsnorm_forward_ref(static_cast<int>(c), static_cast<int>(h), eps(), x, (first ? layer->norm1 : layer->norm2).weight, y);
        out(first ? Role::n1 : Role::n2, rounded(std::move(y)));
        return;
      }
      case OpCode::qkv: {
        expect_gemm(id, task_tokens(c), q + 2 * kv, h);
        const auto y = linear(in(Role::n1), layer->wqkv.weight, c, h, q + 2 * kv);
        std::vector<float> qs, ks, vs;
        for (std::int64_t r = 0; r < c; ++r) {
          const auto row = y.begin() + r * (q + 2 * kv);
          qs.insert(qs.end(), row, row + q);
          ks.insert(ks.end(), row + q, row + q + kv);
          vs.insert(vs.end(), row + q + kv, row + q + 2 * kv);
        }
        out(Role::q, rounded(std::move(qs)));
        out(Role::k, rounded(std::move(ks)));
        out(Role::v, rounded(std::move(vs)));
        return;
      }
      case OpCode::rope: {
        std::vector<float> qs = in(Role::q), ks = in(Role::k);
        kernels::rope_ref(static_cast<int>(c), H, D, op.chunk * c, rope_theta(), false, qs);
        kernels::rope_ref(static_cast<int>(c), static_cast<int>(m_.kv_heads), D, op.chunk * c, rope_theta(), false, ks);
        out(Role::q, rounded(std::move(qs)));
        out(Role::k, rounded(std::move(ks)));
        return;
      }
      case OpCode::attn: {
        expect_attention(id, op);
        const auto shape = attention_shape(op);
        const auto [k, v] = gather_kv(op);
        std::vector<float> o_part(static_cast<std::size_t>(c * q)), lse_part(static_cast<std::size_t>(H * c));
        kernels::attention_forward_ref(shape, in(Role::q), k, v, o_part, lse_part);
        round(o_part);  // partials are written in bf16
        std::vector<float> o_run(o_part.size(), 0.0f), lse(lse_part.size(), -std::numeric_limits<float>::infinity());
        if (!starts_accumulation(op)) {  // not the diagonal (which comes first): fold into the running state
          o_run = in(Role::o_run);
          lse = in(Role::lse);
        }
        kernels::attention_merge_ref(static_cast<int>(c), H, D, o_run, lse, o_part, lse_part);
        out(Role::o, rounded(o_run));
        out(Role::o_run, std::move(o_run));
        out(Role::lse, std::move(lse));
        return;
      }
      case OpCode::attn_merge: out(Role::o, rounded(in(Role::o_run))); return;
      case OpCode::residual1:
      case OpCode::residual2: {
        const bool first = op.code == OpCode::residual1;
        std::vector<float> y = in(first ? Role::x : Role::h1);
        const auto& branch = in(first ? Role::p : Role::mo);
        for (std::size_t i = 0; i < y.size(); ++i) y[i] += branch[i];
        round(y);
        if (first) {
          out(Role::h1, std::move(y));
        } else {  // the next layer's input (layer L's: the final hidden state)
          out(Role::x, std::move(y));
        }
        return;
      }
      case OpCode::act: {
        std::vector<float> gate, up;
        split_gate_up(in(Role::gu), gate, up);
        std::vector<float> a(gate.size());
        kernels::swiglu_forward_ref(gate, up, a);
        out(Role::a, rounded(std::move(a)));
        return;
      }

      // ---- backward ------------------------------------------------------------------------------------------
      case OpCode::residual2_bwd: {  // the output's gradient flows into the MLP branch and the residual
        std::vector<float> g = in(Role::dx);
        out(Role::dm, g);
        out(Role::dh1, std::move(g));
        return;
      }
      case OpCode::act_bwd: {
        std::vector<float> gate, up;
        split_gate_up(in(Role::gu), gate, up);
        std::vector<float> d_gate(gate.size()), d_up(up.size());
        kernels::swiglu_backward_ref(gate, up, in(Role::da), d_gate, d_up);
        std::vector<float> dgu(static_cast<std::size_t>(c * 2 * f));
        for (std::int64_t r = 0; r < c; ++r) {
          std::copy_n(d_gate.begin() + r * f, f, dgu.begin() + r * 2 * f);
          std::copy_n(d_up.begin() + r * f, f, dgu.begin() + r * 2 * f + f);
        }
        out(Role::dgu, rounded(std::move(dgu)));
        return;
      }
      case OpCode::norm2_bwd:
      case OpCode::norm1_bwd: {
        const bool second = op.code == OpCode::norm2_bwd;
        const auto& x = in(second ? Role::h1 : Role::x);
        std::vector<float> dx(x.size());
        Parameter& w = second ? layer->norm2 : layer->norm1;
        kernels::rmsnorm_backward_ref(static_cast<int>(c), static_cast<int>(h), eps(), x, w.weight, in(second ? Role::dn2 : Role::dn1), dx, w.grad);
        grad_written(op.layer, id);
        const auto& skip = in(Role::dh1);  // the residual's share of the gradient
        for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += skip[i];
        out(second ? Role::dh1 : Role::dx, rounded(std::move(dx)));
        return;
      }
      case OpCode::residual1_bwd: out(Role::dp, in(Role::dh1)); return;
      case OpCode::attn_bwd: {
        expect_attention(id, op);
        const auto shape = attention_shape(op);
        const auto [k, v] = gather_kv(op);
        std::vector<float> dq(static_cast<std::size_t>(c * q), 0.0f), delta(static_cast<std::size_t>(H * c));
        if (starts_accumulation(op)) {  // the diagonal comes first: it starts dQ and computes D = rowsum(dO * O)
          kernels::attention_backward_prep_ref(static_cast<int>(c), H, D, in(Role::o), in(Role::d_o), delta);
        } else {
          dq = in(Role::dq);
          delta = in(Role::delta);
        }
        const std::size_t chunk_kv = static_cast<std::size_t>(c * kv);
        std::vector<float> dk(k.size(), 0.0f), dv(v.size(), 0.0f);
        kernels::attention_backward_ref(shape, in(Role::q), k, v, in(Role::d_o), in(Role::lse), delta, dq, dk, dv);
        for (int j = op.kv_first; j <= op.kv_last; ++j) {  // add into each chunk's fp32 accumulator
          std::vector<float> sum = exists(named_->use(Role::dkv, j).key) ? in(Role::dkv, j) : std::vector<float>(2 * chunk_kv, 0.0f);
          const std::size_t at = static_cast<std::size_t>(j - op.kv_first) * chunk_kv;
          for (std::size_t i = 0; i < chunk_kv; ++i) {
            sum[i] += dk[at + i];
            sum[chunk_kv + i] += dv[at + i];
          }
          out(Role::dkv, std::move(sum), j);
        }
        out(Role::dq, std::move(dq));
        out(Role::delta, std::move(delta));
        return;
      }
      case OpCode::dkv_add: {  // a ring-attention rank's own share of dK | dV plus what the ring brought
        for (int j = op.kv_first; j <= op.kv_last; ++j) {
          const Key own = named_->use(Role::dkv, j).key;
          std::vector<float> sum = in(Role::dkv_in, j);
          if (exists(own)) {
            const auto& mine = in(Role::dkv, j);
            for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += mine[i];
          }
          out(Role::dkv, std::move(sum), j);
        }
        return;
      }
      case OpCode::rope_bwd: {  // undo RoPE on dQ and this chunk's (now complete) dK; dV passes through
        std::vector<float> dq = in(Role::dq);
        const auto& acc = in(Role::dkv);
        const std::size_t chunk_kv = static_cast<std::size_t>(c * kv);
        std::vector<float> dk(acc.begin(), acc.begin() + static_cast<std::ptrdiff_t>(chunk_kv));
        kernels::rope_ref(static_cast<int>(c), H, D, op.chunk * c, rope_theta(), true, dq);
        kernels::rope_ref(static_cast<int>(c), static_cast<int>(m_.kv_heads), D, op.chunk * c, rope_theta(), true, dk);
        std::vector<float> dqkv(static_cast<std::size_t>(c * (q + 2 * kv)));
        for (std::int64_t r = 0; r < c; ++r) {
          auto row = dqkv.begin() + r * (q + 2 * kv);
          std::copy_n(dq.begin() + r * q, q, row);
          std::copy_n(dk.begin() + r * kv, kv, row + q);
          std::copy_n(acc.begin() + static_cast<std::ptrdiff_t>(chunk_kv) + r * kv, kv, row + q + kv);
        }
        out(Role::dqkv, rounded(std::move(dqkv)));
        return;
      }
      case OpCode::embed_bwd: {
        const auto& dx = in(Role::dx);
        auto& de = s_.embedding().grad;
        for (std::int64_t r = 0; r < c; ++r) {
          const std::int64_t row = token(op.seq, op.chunk * c + r);
          for (std::int64_t i = 0; i < h; ++i) de[row * h + i] += dx[r * h + i];
        }
        grad_written(kEmbeddingGroup, id);
        return;
      }

      // ---- the LM head: final norm, logits, cross-entropy and their backward, on rows [first, last) --------
      case OpCode::head_logits:
      case OpCode::head_xent:
      case OpCode::head_dgrad:
      case OpCode::head_wgrad: return head(id, op);
      default: break;
    }
    fail(id, "op " + std::string(sim::to_string(op.code)) + " is not one the executor runs");
  }

  void split_gate_up(const std::vector<float>& gu, std::vector<float>& gate, std::vector<float>& up) const {
    const std::int64_t f = m_.ffn_hidden;
    const std::int64_t rows = static_cast<std::int64_t>(gu.size()) / (2 * f);
    gate.resize(static_cast<std::size_t>(rows * f));
    up.resize(static_cast<std::size_t>(rows * f));
    for (std::int64_t r = 0; r < rows; ++r) {
      std::copy_n(gu.begin() + r * 2 * f, f, gate.begin() + r * f);
      std::copy_n(gu.begin() + r * 2 * f + f, f, up.begin() + r * f);
    }
  }

  void head(sim::TaskId id, const sim::Op& op) {
    using sim::OpCode;
    const std::int64_t h = m_.hidden, vocab = m_.vocab;
    const std::int64_t first = op.row_begin, rows = op.row_end - op.row_begin;
    if (first < 0 || rows <= 0 || op.row_end > c_) fail(id, "LM head rows outside the chunk");
    auto hidden_rows = [&]() {
      const auto& x = in(Role::x);
      return std::vector<float>(x.begin() + first * h, x.begin() + (first + rows) * h);
    };
    Parameter& w = s_.lm_head();
    const int head_group = m_.tied_embeddings ? kEmbeddingGroup : kHeadGroup;
    switch (op.code) {
      case OpCode::head_logits: {
        expect_gemm(id, task_tokens(rows), vocab, h);
        std::vector<float> nf(static_cast<std::size_t>(rows * h));
        kernels::rmsnorm_forward_ref(static_cast<int>(rows), static_cast<int>(h), eps(), hidden_rows(), s_.final_norm().weight, nf);
        round(nf);
        out(Role::logits, rounded(linear(nf, w.weight, rows, h, vocab)));  // bf16, as the GPU's loss kernels read them
        out(Role::nf, std::move(nf));
        return;
      }
      case OpCode::head_xent: {
        const auto& logits = in(Role::logits);
        std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
        for (std::int64_t r = 0; r < rows; ++r) targets[r] = token(op.seq, op.chunk * c_ + first + r + 1);
        std::vector<float> loss(static_cast<std::size_t>(rows)), lse(static_cast<std::size_t>(rows));
        kernels::cross_entropy_forward_ref(static_cast<int>(rows), static_cast<int>(vocab), logits, targets, loss, lse);
        for (float l : loss) loss_sum_ += l;
        loss_rows_ += rows;
        // The step's loss is the mean over all its tokens: each token's loss has weight 1 / tokens.
        const std::vector<float> dloss(static_cast<std::size_t>(rows), 1.0f / static_cast<float>(total_tokens_));
        std::vector<float> dlogits(logits.size());
        kernels::cross_entropy_backward_ref(static_cast<int>(rows), static_cast<int>(vocab), logits, targets, lse, dloss, dlogits);
        out(Role::dlogits, rounded(std::move(dlogits)));
        return;
      }
      case OpCode::head_dgrad: {
        expect_gemm(id, task_tokens(rows), h, vocab);
        const auto dnf = rounded(linear_dgrad(in(Role::dlogits), w.weight, rows, h, vocab));
        std::vector<float> dx_rows(static_cast<std::size_t>(rows * h));
        kernels::rmsnorm_backward_ref(static_cast<int>(rows), static_cast<int>(h), eps(), hidden_rows(), s_.final_norm().weight, dnf, dx_rows,
                                      s_.final_norm().grad);
        grad_written(kHeadGroup, id);
        std::vector<float> dx = starts_accumulation(op) ? std::vector<float>(static_cast<std::size_t>(c_ * h), 0.0f) : in(Role::dx);
        std::copy(dx_rows.begin(), dx_rows.end(), dx.begin() + first * h);
        out(Role::dx, rounded(std::move(dx)));
        return;
      }
      case OpCode::head_wgrad:
        expect_gemm(id, h, vocab, task_tokens(rows));
        linear_wgrad(in(Role::dlogits), in(Role::nf), w.grad, rows, h, vocab);
        grad_written(head_group, id);
        return;
      default: fail(id, "not an LM head op");
    }
  }

  const sim::TaskGraph& g_;
  ModelState& s_;
  const model::ModelConfig& m_;
  std::int64_t c_;
  int gpn_;
  std::span<const std::vector<std::int32_t>> tokens_;
  ReferenceOptions opt_;
  Communicator* comm_;  // null: one rank runs everything
  std::int64_t seq_len_ = 0, total_tokens_ = 0;

  std::vector<std::vector<sim::TaskId>> preds_;
  Current current_;
  std::optional<OpTensors> named_;
  std::vector<std::vector<std::uint64_t>> ancestors_;
  std::map<std::pair<sim::DeviceId, Key>, Slot> store_;
  std::map<Key, std::int64_t> latest_;
  std::int64_t expanded_task_tokens_ = -1;  // see task_tokens
  std::map<int, GroupState> groups_;
  // Each reduced parameter's last sum over each set of ranks (reduce_gradients): a reduction over other ranks (the
  // tied embeddings' pair after the data-parallel one) sums the values themselves.
  std::map<std::pair<const Parameter*, std::vector<int>>, std::vector<float>> last_reduced_;
  double loss_sum_ = 0;
  std::int64_t loss_rows_ = 0;  // tokens the loss saw, against the tokens given
  bool has_optimizer_ = false;
  std::int64_t reads_checked_ = 0;
};

}  // namespace

ReferenceResult run_reference_step(const sim::TaskGraph& graph, ModelState& state, int gpus_per_node,
                                   std::span<const std::vector<std::int32_t>> tokens, const ReferenceOptions& options) {
  return ReferenceStep(graph, state, gpus_per_node, tokens, options).run();
}

void gather_to_rank0(const sim::TaskGraph& graph, ModelState& state, Communicator& comm) {
  if (comm.size() <= 1) return;
  int tag = 0;
  for (const auto& [group, owners] : forward_owners(graph)) {
    const sim::DeviceId owner = *owners.begin();  // the lowest GPU running the group's forward
    for (Parameter* p : state.group(group)) {
      for (std::vector<float>* values : {&p->grad, &p->weight}) {
        ++tag;
        if (owner == 0) continue;
        if (comm.rank() == owner) send_floats(comm, 0, tag, *values);
        if (comm.rank() == 0) {
          std::vector<float> got = recv_floats(comm, owner, tag);
          if (got.size() != values->size()) throw TRAINYARD_COMM_ERROR("rank 0: rank " + std::to_string(owner) + " sent a tensor of another size");
          *values = std::move(got);
        }
      }
    }
  }
  comm.barrier();
}

}  // namespace trainyard::backend
