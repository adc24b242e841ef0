#include "backend/reference_step.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "backend/parameter_groups.hpp"
#include "backend/reference_ops.hpp"
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

class ReferenceStep : private ReferenceTask {
 public:
  ReferenceStep(const sim::TaskGraph& graph, ModelState& state, int gpus_per_node, std::span<const std::vector<std::int32_t>> tokens,
                const ReferenceOptions& options)
      : g_(graph),
        s_(state),
        m_(state.model()),
        chunk_tokens_(graph.chunk_tokens()),
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
    check_sequence_length(g_, seq_len_);
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
    write(task, to, delivered,
          std::vector<float>(static_cast<std::size_t>(chunk_tensor(delivered.role, model_of(op, m_), chunk_tokens_).elements), 0.0f));
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

  // The compute task being run, its tensors found by name through the op table (ops.hpp): a tensor its entry
  // does not name fails at once.
  struct Current {
    sim::TaskId id = -1;
    sim::DeviceId gpu = 0;
    std::vector<Use> uses;
  };
  // ReferenceTask: what the running op (reference_ops.cpp) reads, writes and checks.
  const std::vector<float>& in(Role role, int kv_chunk = -1) override { return read(current_.id, current_.gpu, named_->use(role, kv_chunk).key); }
  void out(Role role, std::vector<float> data, int kv_chunk = -1) override {
    write(current_.id, current_.gpu, named_->use(role, kv_chunk, true).key, std::move(data));
  }
  bool holds(Role role, int kv_chunk) const override { return exists(named_->use(role, kv_chunk).key); }
  [[noreturn]] void fail(const std::string& what) const override { fail(current_.id, what); }

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

  void expect_gemm(std::int64_t m, std::int64_t n, std::int64_t k) const override {
    const sim::TaskId id = current_.id;
    const auto* gemm = std::get_if<sim::Gemm>(&g_.task(id).params);
    if (!gemm) fail(id, "expected a GEMM task for op " + std::string(sim::to_string(g_.task(id).op.code)));
    if (gemm->m != m || gemm->n != n || gemm->k != k) {
      fail(id, "the graph's GEMM is " + std::to_string(gemm->m) + " x " + std::to_string(gemm->n) + " x " + std::to_string(gemm->k) +
                   " but the layer runs " + std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k));
    }
  }

  void wrote_gradients(int group) override {
    const sim::TaskId id = current_.id;
    GroupState& state = groups_[group];
    const auto reduced = state.last_reduction.find(g_.task(id).device);
    if (reduced != state.last_reduction.end() && !ordered(reduced->second, id)) {
      fail(id, "adds to gradients that " + name(reduced->second) + " may still be reducing: a race");
    }
    state.grad_writers.push_back(id);
  }

  void expect_attention(const sim::Op& op) const override {
    const sim::TaskId id = current_.id;
    const auto* a = std::get_if<sim::Attention>(&g_.task(id).params);
    if (!a) fail(id, "expected an attention task");
    const auto s = attention_shape(op, m_, chunk_tokens_);
    const bool lengths_differ = expanded_task_tokens_ < 0 && (a->q_len != s.q_len || a->kv_len != s.kv_len);  // see expect_pairs
    const int sequences = g_.task(id).op.seq_count;  // the graph folds a micro-batch's sequences into its heads
    if (lengths_differ || a->heads != s.heads * sequences || a->kv_heads != s.kv_heads * sequences || a->head_dim != s.head_dim) {
      fail(id, "the graph's attention is " + std::to_string(a->q_len) + " queries x " + std::to_string(a->kv_len) + " keys but the op covers " +
                   std::to_string(s.q_len) + " x " + std::to_string(s.kv_len));
    }
    if (op.kv_first < 0 || op.kv_last < op.kv_first || op.kv_last > op.chunk) fail(id, "attends to chunks outside 0..its own");
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
    const std::vector<sim::Op> ops = chunk_ops(op, chunk_tokens_);
    if (ops.size() == 1) return compute(id, t.device, ops.front());  // a piece of a zigzag or run rebased into its chunk
    // A zigzag, run (FPDT), micro-batch or Ulysses op, one chunk (pair) at a time; a GEMM's task spans all its chunks' rows.
    const bool head = op.is_lm_head();
    expanded_task_tokens_ = head ? op.row_end - op.row_begin : static_cast<std::int64_t>(covered_chunks(op).size()) * chunk_tokens_ * op.seq_count;
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
    for (const sim::Op& one : ops) op_pairs += static_cast<double>(chunk_tokens_ * chunk_tokens_) * (one.kv_first == one.chunk ? 0.5 : 1.0);
    op_pairs /= std::max<int>(1, g_.task(id).op.seq_count);                             // the graph folds a micro-batch's sequences into its heads
    if (std::abs(graph_pairs - op_pairs) > 0.5 * static_cast<double>(chunk_tokens_)) {  // causal diagonals: within a row's half
      fail(id, "the graph's attention covers " + std::to_string(graph_pairs) + " query-key pairs but its chunk pairs " + std::to_string(op_pairs));
    }
  }

  // --- Ulysses' all-to-alls ----------------------------------------------------------------------------------
  // Head group g's columns of every row and block, out of `all` (to_group) or into it.
  void head_slice(const HeadsExchanged& e, int groups, int g, std::vector<float>& all, std::vector<float>& part, bool to_group) const {
    const std::int64_t width = width_elements(e.row, m_), w = width / groups, rows = chunk_tokens_ * e.blocks;
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
      const auto piece = static_cast<std::size_t>(chunk_tokens_ * e.blocks * width_elements(e.row, m_) / groups);  // one chunk's head group
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

  // One chunk (pair) of a compute task, checked against the graph's coordinates, then its op (reference_ops.cpp).
  void compute(sim::TaskId id, sim::DeviceId gpu, const sim::Op& op) {
    current_ = {id, gpu, compute_uses(op, m_, chunk_tokens_)};
    named_.emplace(op, current_.uses);
    if (op.layer < 0 || op.chunk < 0 || op.seq < 0) fail(id, "an op without its coordinates");
    if (op.seq >= static_cast<int>(tokens_.size())) {
      throw InputError("the step's tokens", "sequences", "at least " + std::to_string(op.seq + 1) + " (the graph's sequences)",
                       std::to_string(tokens_.size()));
    }
    if (op.layer > m_.layers || (op.layer == m_.layers) != op.is_lm_head()) {
      fail(id, "layer " + std::to_string(op.layer) + " out of range for op " + std::string(sim::to_string(op.code)));
    }
    ReferenceOpArgs a;
    a.op = &op;
    a.task = this;
    a.state = &s_;
    a.chunk_tokens = chunk_tokens_;
    a.task_rows = expanded_task_tokens_;
    a.tokens = tokens_;
    a.step_tokens = total_tokens_;
    a.emulate_bf16 = opt_.emulate_bf16;
    a.loss_sum = &loss_sum_;
    a.loss_rows = &loss_rows_;
    run_reference_op(a);
  }

  const sim::TaskGraph& g_;
  ModelState& s_;
  const model::ModelConfig& m_;
  std::int64_t chunk_tokens_;
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
  std::int64_t expanded_task_tokens_ = -1;  // a zigzag, run or micro-batch task's GEMM rows (ReferenceOpArgs::task_rows); -1 outside one
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
