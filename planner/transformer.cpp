#include "planner/transformer.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "common/error.hpp"
#include "sim/cost_model.hpp"

namespace trainyard::planner {

std::string_view to_string(CpComm c) {
  switch (c) {
    case CpComm::p2p: return "p2p";
    case CpComm::all_gather: return "all_gather";
    case CpComm::a2a: return "a2a";
    case CpComm::a2a_p2p: return "a2a+p2p";
  }
  return "?";
}

std::optional<CpComm> cp_comm_named(std::string_view name) {
  for (CpComm c : {CpComm::p2p, CpComm::all_gather, CpComm::a2a, CpComm::a2a_p2p}) {
    if (to_string(c) == name) return c;
  }
  return std::nullopt;
}

std::string_view to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

namespace {
constexpr double kBf16 = 2;
// K/V heads per TP rank: split while there are enough, replicated below that.
std::int64_t local_kv_heads(const model::ModelConfig& m, int tp) { return std::max<std::int64_t>(1, m.kv_heads / tp); }

// One pass of a K/V ring: K and V of `k_elements` each in bf16; backward also the fp32 dK, dV accumulators.
double kv_pass_bytes(double k_elements, bool backward) { return backward ? 2 * k_elements * kBf16 + 2 * k_elements * 4 : 2 * k_elements * kBf16; }

// One collective over `group` (`size` ranks; under symmetry, a ring of `ring_ranks` of which the group holds the built
// ones) after the chain ends last[first, first + count), which it becomes.
void emit_collective(sim::TaskGraph& graph, const std::string& name, sim::CollectiveOp op, double bytes, std::int32_t group, int size,
                     std::vector<sim::TaskId>& last, std::size_t first, std::size_t count, std::int32_t ring_ranks = 0) {
  std::vector<sim::TaskId> deps;
  for (std::size_t r = first; r < first + count; ++r) {
    if (last[r] >= 0) deps.push_back(last[r]);
  }
  const auto rounded = (static_cast<std::int64_t>(bytes) + size - 1) / size * size;  // a multiple of the group size
  const sim::TaskId c = graph.collective(name, {op, sim::Algorithm::ring, group, rounded, ring_ranks}, deps);
  std::fill(last.begin() + static_cast<std::ptrdiff_t>(first), last.begin() + static_cast<std::ptrdiff_t>(first + count), c);
}
}  // namespace

ActivationBytes layer_activation_bytes(const model::ModelConfig& m, const LayerSplit& split, Recompute recompute) {
  // Ulysses keeps everything for its b*S/P tokens (attention tensors are head-sharded, the same size).
  const double s = static_cast<double>(split.local_tokens());
  const double h = static_cast<double>(m.hidden);
  const double t = split.tp;
  // Tensors of the full hidden size are replicated across TP ranks unless sequence parallelism splits them.
  const double replicated = split.sequence_parallel ? 1.0 / t : 1.0;
  ActivationBytes a;
  if (recompute == Recompute::full) {
    a.norms = kBf16 * s * h * replicated;  // the layer input, from which everything is recomputed
    return a;
  }
  const double q = static_cast<double>(m.q_dim()) / t;
  const double kv = static_cast<double>(local_kv_heads(m, split.tp) * m.head_dim);
  const double f = static_cast<double>(m.ffn_hidden) / t;
  a.norms = 2 * kBf16 * s * h * replicated;
  a.projection_inputs = 2 * kBf16 * s * h * replicated;
  a.attention = kBf16 * s * (q + 2 * kv) + kBf16 * s * q + 4.0 * s * static_cast<double>(m.heads) / t;  // q,k,v; o; lse
  a.mlp = m.activation == model::Activation::swiglu ? 3 * kBf16 * s * f                                 // gate, up, their product
                                                    : 2 * kBf16 * s * f;                                // GELU input and output
  if (split.dropout) a.dropout_masks = 2 * s * h * replicated;                                          // after attention and after the MLP
  if (recompute == Recompute::none && split.score_bytes > 0) {
    // Each GPU's heads see the whole sequence (Ulysses gathers it): heads/(t*u) x b x S x S scores.
    const double local_heads = static_cast<double>(m.heads) / (t * split.ulysses);
    const double seq = static_cast<double>(split.sequence_tokens);
    a.attention += split.score_bytes * local_heads * static_cast<double>(split.sequences) * seq * seq;
  }
  return a;
}

double stored_score_bytes(const sim::Cluster& cluster) {
  const sim::ComputeModel compute(cluster.node, cluster.stack);
  return compute.attention_impl() == stacks::AttentionImpl::unfused ? cluster.stack.attention.stored_bytes_per_score.value : 0;
}

double tp_bytes_per_layer_forward(const model::ModelConfig& m, const LayerSplit& split) {
  const double t = split.tp;
  if (split.tp == 1) return 0;
  const double buffer = kBf16 * static_cast<double>(split.local_tokens()) * static_cast<double>(m.hidden);
  return 2 * 2 * (t - 1) / t * buffer;
}

double ring_bytes_per_layer(const model::ModelConfig& m, const LayerSplit& split, bool backward) {
  if (split.cp == 1) return 0;
  const double block = static_cast<double>(split.local_tokens() * local_kv_heads(m, split.tp) * m.head_dim);  // elements of K
  return static_cast<double>(split.cp - 1) * kv_pass_bytes(block, backward);
}

double cp_gathered_kv_bytes(const model::ModelConfig& m, const LayerSplit& split) {
  return 2 * kBf16 * static_cast<double>(split.tokens() * local_kv_heads(m, split.tp) * m.head_dim);
}

double ulysses_bytes_per_layer_forward(const model::ModelConfig& m, const LayerSplit& split) {
  if (split.ulysses == 1) return 0;
  const double local = static_cast<double>(split.local_tokens());
  return kBf16 * local * static_cast<double>(2 * m.q_dim() + 2 * m.kv_dim());
}

LayerEmitter::LayerEmitter(sim::TaskGraph& graph, const model::ModelConfig& model, const LayerSplit& split, std::vector<sim::DeviceId> ranks)
    : graph_(graph), model_(model), split_(split), ranks_(std::move(ranks)) {
  TRAINYARD_CHECK(split.ulysses == 1 || (split.tp == 1 && split.cp == 1), "Ulysses combines with neither TP nor CP");
  TRAINYARD_CHECK(static_cast<int>(ranks_.size()) == split.built_tp() * split.ulysses * split.built_cp(), "one rank per shard");
  TRAINYARD_CHECK(split.built_cp() == split.cp || (split.zigzag && split.built_cp() >= 2), "reduced cp ranks need zigzag");
  auto group_of = [&](int first, int count, int stride) {
    std::vector<sim::DeviceId> members;
    for (int i = 0; i < count; ++i) members.push_back(ranks_[first + i * stride]);
    return graph_.add_group(members);
  };
  if (split.tp > 1) {
    for (int c = 0; c < split.built_cp(); ++c) tp_groups_.push_back(group_of(c * split.built_tp(), split.built_tp(), 1));
  }
  if (split.cp > 1 && split.cp_comm != CpComm::p2p) {  // one group per TP index, or per a2a_p2p's a2a level
    const int size = split.cp_comm == CpComm::a2a_p2p ? split.cp_a2a : split.built_cp();
    for (int t = 0; t < split.built_tp(); ++t) {
      for (int first = 0; first < split.built_cp(); first += size) {
        CpGroup g{group_of(static_cast<int>(rank_index(first, t)), size, split.built_tp()), {}};
        for (int c = first; c < first + size; ++c) g.members.push_back(rank_index(c, t));
        cp_groups_.push_back(std::move(g));
      }
    }
  }
  if (split.ulysses > 1) ulysses_group_ = graph_.add_group(ranks_);
}

void LayerEmitter::each_rank(const std::string& name, const sim::TaskParams& params, std::vector<sim::TaskId>& last, bool recompute,
                             sim::OpCode code) {
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    std::array<sim::TaskId, 2> deps{};  // no allocation: this runs for nearly every task of a step
    std::size_t dep_count = 0;
    if (last[r] >= 0) deps[dep_count++] = last[r];
    if (!join_.empty() && join_[r] >= 0) deps[dep_count++] = join_[r];
    sim::Op o = op(code);
    o.chunk = chunk_of(r);
    last[r] = graph_.add(name, {ranks_[r], {sim::StreamKind::compute, 0}, recompute, params, o}, std::span(deps.data(), dep_count));
  }
  join_.clear();
}

void LayerEmitter::gemm(const std::string& name, sim::OpCode code, std::int64_t m, std::int64_t n, std::int64_t k, std::vector<sim::TaskId>& last,
                        bool recompute) {
  each_rank(name, sim::Gemm{std::max<std::int64_t>(m, 1), std::max<std::int64_t>(n, 1), std::max<std::int64_t>(k, 1), hw::Dtype::bf16}, last,
            recompute, code);
}

void LayerEmitter::elementwise(const std::string& name, sim::OpCode code, double read, double written, std::vector<sim::TaskId>& last,
                               bool recompute) {
  each_rank(name, sim::Elementwise{static_cast<std::int64_t>(read), static_cast<std::int64_t>(written)}, last, recompute, code);
}

void LayerEmitter::attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute) {
  if (attention_hook_) return attention_hook_(name, backward, last, recompute);
  if (split_.cp > 1) {
    switch (split_.cp_comm) {
      case CpComm::all_gather: return allgather_attention(name, backward, last, recompute);
      case CpComm::a2a: return a2a_attention(name, backward, last, recompute);
      case CpComm::a2a_p2p: return a2a_p2p_attention(name, backward, last, recompute);
      case CpComm::p2p: return ring_attention(name, backward, last, recompute);
    }
  }
  if (split_.fpdt_chunks > 1) return fpdt_attention(name, backward, last, recompute);
  const int shards = split_.tp * split_.ulysses;
  const auto heads = static_cast<std::int32_t>(split_.sequences * model_.heads / shards);  // batch folded into heads
  const auto kv_heads = static_cast<std::int32_t>(split_.sequences * local_kv_heads(model_, shards));
  const auto before = static_cast<sim::TaskId>(graph_.size());
  each_rank(name,
            sim::Attention{split_.sequence_tokens, split_.sequence_tokens, heads, std::min(kv_heads, heads),
                           static_cast<std::int32_t>(model_.head_dim), true, backward},
            last, recompute, backward ? sim::OpCode::attn_bwd : sim::OpCode::attn);
  for (auto id = before; id < static_cast<sim::TaskId>(graph_.size()); ++id) {
    sim::Op o = graph_.task(id).op;
    o.kv_first = o.kv_last = o.chunk;  // the whole causal square: its own chunk
    graph_.set_op(id, executable_ulysses() ? head_group_op(o, id - before) : o);
  }
}

sim::Op LayerEmitter::head_group_op(sim::Op o, sim::TaskId rank) const {
  const int groups = executable_heads_split();
  const int chunks = split_.zigzag_chunks() > 0 ? split_.zigzag_chunks() : groups;
  o.head_group = static_cast<std::int8_t>(rank);
  o.head_groups = static_cast<std::uint8_t>(groups);
  o.zigzag = 0;  // the op covers every chunk
  o.chunk = chunks - 1;
  o.kv_first = 0;
  o.kv_last = chunks - 1;
  return o;
}

// Ring attention over cp ranks: at step i rank r works on the K/V block that started on rank r - i, while it
// passes the block it holds to rank r + 1 (a message on the cp stream, kCpStream, overlapped with the block's attention).
// Step 0 is the causal diagonal block. Without zigzag a block from a later rank is fully masked, so rank r
// computes only r + 1 of the cp blocks (the imbalance zigzag removes); with zigzag every later step computes
// half a block's pairs on every rank. Backward also passes the fp32 dK, dV accumulators (see ring_steps).
void LayerEmitter::ring_attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute) {
  const int built = split_.built_cp();                                  // built < cp: the built ranks pass among themselves
  const std::int64_t local = split_.local_tokens() / split_.sequences;  // per sequence
  const auto heads = static_cast<std::int32_t>(split_.sequences * model_.heads / split_.tp);
  const auto kv_heads = static_cast<std::int32_t>(split_.sequences * local_kv_heads(model_, split_.tp));
  std::vector<std::vector<std::size_t>> rings(static_cast<std::size_t>(split_.built_tp()));  // one per TP index
  for (int t = 0; t < split_.built_tp(); ++t) {
    for (int r = 0; r < built; ++r) rings[t].push_back(rank_index(r, t));
  }
  const double k_elements = static_cast<double>(split_.local_tokens() * local_kv_heads(model_, split_.tp) * model_.head_dim);
  ring_steps(name, rings, split_.cp, {local, local, heads, kv_heads, static_cast<std::int32_t>(model_.head_dim), false, backward}, k_elements, last,
             recompute);
}

bool LayerEmitter::executable_ulysses() const {
  const int sp = split_.ulysses;
  return sp > 1 && sp <= 127 && split_.tp == 1 && split_.cp == 1 && (split_.fpdt_chunks == 1 || split_.executable_fpdt()) && model_.heads % sp == 0 &&
         model_.kv_heads % sp == 0;
}

int LayerEmitter::executable_heads_split() const {
  if (executable_ulysses()) return split_.ulysses;
  const int a2a = split_.executable_cp_a2a() ? split_.cp : split_.executable_cp_a2a_p2p() ? split_.cp_a2a : 0;
  return a2a > 0 && a2a <= 127 && model_.heads % a2a == 0 && model_.kv_heads % a2a == 0 ? a2a : 0;
}

sim::Op LayerEmitter::on_rank(sim::Op at, std::size_t rank) const {
  const int run = split_.fpdt_run();
  if (split_.executable_ring() || split_.executable_cp_allgather() || executable_heads_split() > 0 || split_.executable_fpdt()) {
    at = sim::Op::chunk_run(at, at.chunk + static_cast<std::int32_t>(rank) / split_.built_tp() * run, run);
  }
  at.zigzag = split_.zigzag_chunks();
  // A micro-batch of several sequences: the op covers each (the executors run more than 255 nowhere).
  if (split_.sequences > 1 && split_.sequences <= 255) at = sim::Op::sequences(at, static_cast<std::int32_t>(split_.sequences));
  return at;
}

std::pair<std::int32_t, std::int32_t> LayerEmitter::ring_block(std::size_t rank) const {
  if (!split_.executable_cp_a2a_p2p()) return {chunk_of(rank), 1};
  const int a = split_.cp_a2a;
  return {static_cast<std::int32_t>(rank) / a * a, a};
}

sim::Op LayerEmitter::ring_op(sim::OpCode code, std::size_t rank, std::size_t block_rank, std::size_t from_rank) const {
  const bool hierarchical = split_.executable_cp_a2a_p2p() && executable_heads_split() > 0;
  if (!split_.executable_ring() && !hierarchical) return {};
  const auto [first, count] = ring_block(rank);
  const auto [block_first, block_count] = ring_block(block_rank);
  sim::Op o = sim::Op::chunk_run(sim::Op::kv_range(code, at_.seq, at_.layer, 0, block_first, block_first + block_count - 1), first, count);
  o.zigzag = split_.zigzag_chunks();
  if (hierarchical) {
    o.head_group = static_cast<std::int8_t>(static_cast<int>(rank) % count);
    o.head_groups = static_cast<std::uint8_t>(count);
  }
  if (code == sim::OpCode::kv) return o;
  const std::int32_t holder = rank == block_rank ? -1 : first;  // -1: the owner's own accumulator
  return sim::Op::ring_share(o, holder, code == sim::OpCode::dkv_add ? ring_block(from_rank).first : -1);
}

sim::TaskId LayerEmitter::ring_send(RingPass& pass, const std::string& label, std::size_t from, std::size_t to, std::int64_t bytes,
                                    std::vector<sim::TaskId> deps, sim::Op op) {
  std::erase(deps, sim::TaskId{-1});
  pass.outgoing[from] = graph_.send(pass.name + label, ranks_[from], ranks_[to], bytes, deps, kCpStream);
  graph_.set_op(pass.outgoing[from], op);
  return pass.outgoing[from];
}

// The accumulator of `owner`'s block from where it is to ring position `to` (which posted the receive after
// `posted`), added in there after its chain.
void LayerEmitter::bring_accumulator(RingPass& pass, const std::vector<std::size_t>& ring, const std::vector<Accumulator>& accumulators, int owner,
                                     int to, sim::TaskId posted, std::vector<sim::TaskId>& last) {
  const Accumulator& a = accumulators[owner];
  const std::size_t ti = ring[to], from = ring[a.holder];
  const std::string block = " of block " + std::to_string(owner);  // names unique per GPU: compare matches by them
  const sim::TaskId moved = ring_send(pass, " ring dkv pass" + block, from, ti, pass.dkv_bytes, {a.ready, posted},
                                      ring_op(sim::OpCode::dkv_pass, from, ring[owner]));
  last[ti] = graph_.add(pass.name + " dkv add" + block,
                        {ranks_[ti],
                         {sim::StreamKind::compute, 0},
                         false,
                         sim::Elementwise{2 * pass.dkv_bytes, pass.dkv_bytes},
                         ring_op(sim::OpCode::dkv_add, ti, ring[owner], from)},
                        {last[ti], moved});
}

// Forward, each step passes K and V on. Backward passes them the same way, and each block's fp32 dK | dV
// accumulator follows the ranks that work on it (Transformer Engine's ring): the first rank after the block's
// owner to compute on it starts it, each later one computes its own share while the accumulator is on its way,
// then adds it in (dkv_add) and sends the sum on after its block; the last one sends it home, where the owner adds
// it to its diagonal share. A fully masked block adds nothing, so its accumulator skips that rank.
// A message needs its receiver to have posted the receive: into a buffer double-buffered across steps, so after
// the receiver's previous step. And every rank waits for its own messages to leave before it goes on after the
// ring, as Transformer Engine waits for its send requests: nothing overwrites a block another rank still reads.
void LayerEmitter::ring_steps(const std::string& name, const std::vector<std::vector<std::size_t>>& rings, int steps, sim::Attention block,
                              double k_elements, std::vector<sim::TaskId>& last, bool recompute) {
  const bool backward = block.backward;
  RingPass pass{name, std::max<std::int64_t>(1, static_cast<std::int64_t>(kv_pass_bytes(k_elements, false))),
                std::max<std::int64_t>(1, static_cast<std::int64_t>(kv_pass_bytes(k_elements, true) - kv_pass_bytes(k_elements, false))),
                std::vector<sim::TaskId>(ranks_.size(), -1)};
  for (const auto& ring : rings) {
    const int size = static_cast<int>(ring.size());
    std::vector<Accumulator> accumulators(ring.size());  // by the block's owner
    std::vector<sim::TaskId> sent(ring.size(), -1);      // the previous step's K/V messages, by sender
    for (int step = 0; step < steps; ++step) {
      const std::vector<sim::TaskId> posted = last;  // where each rank posts this step's receives
      std::vector<sim::TaskId> now_sent(ring.size(), -1);
      auto owner_at = [&](int r) { return (((r - step) % size) + size) % size; };  // whose block rank r holds
      auto received_at = [&](int r) { return step == 0 ? sim::TaskId{-1} : sent[(r - 1 + size) % size]; };
      for (int r = 0; r < size && step + 1 < steps; ++r) {  // every rank passes on what it holds now, first on its stream
        const std::size_t ri = ring[r], next = ring[(r + 1) % size];
        const sim::TaskId received = received_at(r);
        now_sent[r] = ring_send(pass, " ring pass " + std::to_string(step), ri, next, pass.kv_bytes,
                                {received >= 0 ? received : last[ri], posted[next]}, ring_op(sim::OpCode::kv, ri, ring[owner_at(r)]));
      }
      for (int r = 0; r < size; ++r) {
        const std::size_t ri = ring[r];
        const int owner = owner_at(r);
        sim::Attention this_block = block;
        this_block.causal = step == 0;
        if (split_.zigzag && step > 0) {
          this_block.kv_len = block.kv_len / 2;  // half of the pairs of a full block are unmasked
        } else if (!split_.zigzag && r - step < 0) {
          continue;  // a later rank's block, fully masked: nothing to compute, the block only passes through
        }
        std::vector<sim::TaskId> deps{last[ri], received_at(r)};
        std::erase(deps, sim::TaskId{-1});
        last[ri] = graph_.add(name + " block " + std::to_string(step),
                              {ranks_[ri],
                               {sim::StreamKind::compute, 0},
                               recompute,
                               this_block,
                               ring_op(backward ? sim::OpCode::attn_bwd : sim::OpCode::attn, ri, ring[owner])},
                              deps);
        if (!backward || step == 0) continue;  // the diagonal's dK | dV stays with its owner until the rest comes home
        if (accumulators[owner].holder >= 0) bring_accumulator(pass, ring, accumulators, owner, r, posted[ri], last);
        accumulators[owner] = {r, last[ri]};
      }
      sent = now_sent;
    }
    for (int owner = 0; owner < size && backward; ++owner) {
      const int holder = accumulators[owner].holder;
      // Under symmetry (fewer ranks built than steps) the whole ring's last hop: to the holder's successor.
      const int home = steps > size ? (holder + 1) % size : owner;
      if (holder >= 0 && holder != home) bring_accumulator(pass, ring, accumulators, owner, home, last[ring[home]], last);
    }
  }
  join_ = pass.outgoing;  // the rank's next task waits for its messages
  if (backward) return;   // dQ and the dK | dV accumulators are fp32 until rope_bwd turns them to bf16
  // Merge the partial outputs by their log-sum-exp.
  const double q_elements = static_cast<double>(split_.local_tokens() * model_.q_dim() / split_.tp);
  const auto before = static_cast<sim::TaskId>(graph_.size());
  const bool executable = split_.executable_ring() || (split_.executable_cp_a2a_p2p() && executable_heads_split() > 0);
  elementwise(name + " merge", executable ? sim::OpCode::attn_merge : sim::OpCode::none, kBf16 * q_elements * 2, kBf16 * q_elements, last, recompute);
  for (std::size_t r = 0; r < ranks_.size() && split_.executable_cp_a2a_p2p() && executable; ++r) {  // the rank's head group of its group's chunks
    sim::Op merge = ring_op(sim::OpCode::kv, r, r);
    merge.code = sim::OpCode::attn_merge;
    merge.kv_first = merge.kv_last = -1;
    graph_.set_op(before + static_cast<sim::TaskId>(r), merge);
  }
}

// One collective per cp group (per TP index, or per a2a_p2p all-to-all group) on the cp stream, after its
// members' chains, which it ends. With fewer cp ranks built than the step has (symmetry), it runs as the whole
// group's ring.
void LayerEmitter::cp_collective(const std::string& name, sim::CollectiveOp op, std::int64_t bytes, std::vector<sim::TaskId>& last) {
  const std::int32_t ring_ranks = split_.built_cp() < split_.cp ? split_.cp : 0;
  for (const CpGroup& g : cp_groups_) {
    std::vector<sim::TaskId> deps;
    for (std::size_t m : g.members) {
      if (last[m] >= 0) deps.push_back(last[m]);
      if (!join_.empty() && join_[m] >= 0) deps.push_back(join_[m]);  // a ring's messages (ring_steps)
    }
    const sim::TaskId id = graph_.collective(name, {op, sim::Algorithm::ring, g.id, bytes, ring_ranks}, deps, kCpStream);
    for (std::size_t m : g.members) last[m] = id;
  }
  join_.clear();
}

// All-gather context parallelism (Megatron's all_gather comm type; Llama 3's CP): each TP index's cp ranks
// all-gather K and V of the whole sequence, then every rank runs its own load-balanced queries (two zigzag
// chunks, 1/cp of the causal pairs) against them. Backward gathers K, V again and reduce-scatters dK, dV.
void LayerEmitter::allgather_attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute) {
  const int cp = split_.cp;
  const std::int64_t local = split_.local_tokens() / split_.sequences;  // per sequence
  const auto heads = static_cast<std::int32_t>(split_.sequences * model_.heads / split_.tp);
  const auto kv_heads = static_cast<std::int32_t>(split_.sequences * local_kv_heads(model_, split_.tp));
  const auto gathered = static_cast<std::int64_t>(cp_gathered_kv_bytes(model_, split_)) / cp * cp + cp;
  const bool executable = split_.executable_cp_allgather();
  cp_collective(name + " all-gather kv", sim::CollectiveOp::all_gather, gathered, last);
  if (executable) set_cp_group_ops(sim::OpCode::cp_gather_kv, last);
  // local queries x the whole sequence, half of it unmasked on average: 1/cp of the causal pairs
  const auto before = static_cast<sim::TaskId>(graph_.size());
  each_rank(name,
            sim::Attention{local, split_.sequence_tokens / 2, heads, std::min(kv_heads, heads), static_cast<std::int32_t>(model_.head_dim), false,
                           backward},
            last, recompute, sim::OpCode::none);
  for (std::size_t r = 0; r < ranks_.size() && executable; ++r) {  // the rank's queries against every K/V chunk not wholly masked
    const sim::Op at = on_rank(at_, r);
    const std::int32_t kv_last = split_.zigzag ? split_.cp - 1 : at.chunk;  // zigzag: each index a chunk and its mirror
    sim::Op o = sim::Op::kv_range(backward ? sim::OpCode::attn_bwd : sim::OpCode::attn, at.seq, at.layer, at.chunk, 0, kv_last);
    o.zigzag = at.zigzag;
    graph_.set_op(before + static_cast<sim::TaskId>(r), o);
  }
  if (backward) {
    cp_collective(name + " reduce-scatter dkv", sim::CollectiveOp::reduce_scatter, gathered, last);
    if (executable) set_cp_group_ops(sim::OpCode::cp_scatter_dkv, last);
  }
}

void LayerEmitter::set_cp_group_ops(sim::OpCode code, const std::vector<sim::TaskId>& last) {
  sim::Op o = op(code);  // zigzag: each member's chunk and its mirror
  o.chunk = -1;
  for (const CpGroup& g : cp_groups_) graph_.set_op(last[g.members.front()], o);
}

// The all-to-all of a2a CP (and of a2a_p2p's first level) over each cp group: inbound, the local tokens' Q, K, V
// (backward: dO) trade the sequence split for a head split; outbound, the output (backward: dQ, dK, dV) trades back.
void LayerEmitter::cp_exchange_heads(const std::string& name, bool backward, bool inbound, std::vector<sim::TaskId>& last) {
  const auto size = static_cast<std::int64_t>(cp_groups_.front().members.size());
  const double local = static_cast<double>(split_.local_tokens());
  const double q = static_cast<double>(model_.q_dim() / split_.tp);
  const double kv = static_cast<double>(local_kv_heads(model_, split_.tp) * model_.head_dim);
  const bool qkv = inbound != backward;  // forward in, backward out: Q, K and V (or their gradients)
  const auto bytes = static_cast<std::int64_t>(kBf16 * local * (qkv ? q + 2 * kv : q));
  const std::string label = backward ? (inbound ? "a2a dout" : "a2a dqkv") : (inbound ? "a2a qkv" : "a2a out");
  cp_collective(name + " " + label, sim::CollectiveOp::all_to_all, (bytes + size - 1) / size * size, last);  // a multiple of the group
  if (executable_heads_split() == 0) return;
  const sim::OpCode code = backward ? (inbound ? sim::OpCode::heads_dout : sim::OpCode::heads_dqkv)
                                    : (inbound ? sim::OpCode::heads_qkv : sim::OpCode::heads_out);
  for (const CpGroup& g : cp_groups_) {  // a2a+p2p: each group's members hold its run of chunks
    sim::Op o = heads_exchange_op(code);
    o.chunk = chunk_of(g.members.front());
    graph_.set_op(last[g.members.front()], o);
  }
}

// a2a context parallelism (Megatron's a2a comm type: DeepSpeed-Ulysses inside each TP index's cp group): an
// all-to-all trades the sequence split for a head split, each rank attends over the whole sequence with 1/cp of
// its TP rank's heads (K/V heads replicated when there are fewer than cp), and a second all-to-all trades the
// output back. Backward mirrors it: dO in, dQ, dK, dV out. Not reduced by symmetry (every cp rank is built).
void LayerEmitter::a2a_attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute) {
  const int cp = split_.cp;
  TRAINYARD_CHECK(split_.built_cp() == cp, "a2a context parallelism builds every cp rank");
  cp_exchange_heads(name, backward, true, last);
  const auto heads = static_cast<std::int32_t>(split_.sequences * model_.heads / (split_.tp * cp));
  const auto kv_heads = static_cast<std::int32_t>(split_.sequences * std::max<std::int64_t>(1, local_kv_heads(model_, split_.tp) / cp));
  const auto before = static_cast<sim::TaskId>(graph_.size());
  each_rank(name,
            sim::Attention{split_.sequence_tokens, split_.sequence_tokens, heads, std::min(kv_heads, heads),
                           static_cast<std::int32_t>(model_.head_dim), true, backward},
            last, recompute, executable_heads_split() > 0 ? (backward ? sim::OpCode::attn_bwd : sim::OpCode::attn) : sim::OpCode::none);
  for (auto id = before; id < static_cast<sim::TaskId>(graph_.size()) && executable_heads_split() > 0; ++id) {
    graph_.set_op(id, head_group_op(graph_.task(id).op, id - before));
  }
  cp_exchange_heads(name, backward, false, last);
}

// Hierarchical context parallelism (Megatron's a2a+p2p): the all-to-all of a2a CP inside each group of cp_a2a
// consecutive cp ranks (Megatron's first --hierarchical-context-parallel-sizes level), so each rank holds its
// group's cp_a2a load-balanced chunks with 1/cp_a2a of the heads; then the K/V ring of p2p CP across the
// cp / cp_a2a groups, between ranks at the same place in their groups; then the all-to-all back.
void LayerEmitter::a2a_p2p_attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute) {
  const int a = split_.cp_a2a, groups = split_.cp / a;
  TRAINYARD_CHECK(split_.built_cp() == split_.cp && a > 1 && groups > 1 && split_.cp % a == 0, "a2a+p2p builds every cp rank in >= 2 groups of >= 2");
  cp_exchange_heads(name, backward, true, last);
  const std::int64_t tokens = a * split_.local_tokens() / split_.sequences;  // per sequence, after the all-to-all
  const auto heads = static_cast<std::int32_t>(split_.sequences * model_.heads / (split_.tp * a));
  const std::int64_t kv_heads_per_rank = std::max<std::int64_t>(1, local_kv_heads(model_, split_.tp) / a);
  const auto kv_heads = static_cast<std::int32_t>(split_.sequences * kv_heads_per_rank);
  std::vector<std::vector<std::size_t>> rings;  // per TP index and place in the a2a group: that place in every group
  for (int t = 0; t < split_.built_tp(); ++t) {
    for (int i = 0; i < a; ++i) {
      rings.emplace_back();
      for (int g = 0; g < groups; ++g) rings.back().push_back(rank_index(g * a + i, t));
    }
  }
  const double k_elements = static_cast<double>(a * split_.local_tokens() * kv_heads_per_rank * model_.head_dim);
  ring_steps(name, rings, groups, {tokens, tokens, heads, std::min(kv_heads, heads), static_cast<std::int32_t>(model_.head_dim), false, backward},
             k_elements, last, recompute);
  cp_exchange_heads(name, backward, false, last);
}

double fpdt_working_bytes(const model::ModelConfig& m, const LayerSplit& split) {
  const double full = layer_activation_bytes(m, split, Recompute::none).total();
  return split.fpdt_chunks <= 4 ? full : full * 4.0 / split.fpdt_chunks;
}

namespace {
// Per chunk and rank, after the Ulysses exchange: c tokens with heads / sp heads.
struct FpdtChunk {
  double tokens, q, kv;  // tokens per chunk; q and kv widths per rank (elements per token)
};
FpdtChunk fpdt_chunk(const model::ModelConfig& m, const LayerSplit& split) {
  const double shards = split.ulysses;
  return {static_cast<double>(split.tokens()) / split.fpdt_chunks, static_cast<double>(m.q_dim()) / shards, static_cast<double>(m.kv_dim()) / shards};
}
}  // namespace

FpdtCopySizes fpdt_copy_sizes(const model::ModelConfig& m, const LayerSplit& split) {
  const auto c = fpdt_chunk(m, split);
  return {c.tokens * 2 * c.kv * kBf16, c.tokens * (3 * c.q * kBf16 + c.q * 4) + c.tokens * 4, c.tokens * c.q * 4};
}

double fpdt_copy_bytes(const model::ModelConfig& m, const LayerSplit& split, bool backward) {
  if (split.fpdt_chunks <= 1) return 0;
  const FpdtCopySizes c = fpdt_copy_sizes(m, split);
  const double u = split.fpdt_chunks;
  if (!backward) return u * c.kv_bytes + u * (u - 1) / 2 * c.kv_bytes;  // each chunk out once, earlier ones back in
  // Backward: each kv chunk in once; per (kv chunk i, q chunk j >= i) pair q, o, dO (bf16), lse and dq (fp32) in
  // and dq out.
  return u * c.kv_bytes + u * (u + 1) / 2 * (c.pair_in_bytes + c.pair_out_bytes);
}

// FPDT attention (seed 002; design.md 3.2). Forward: chunk i's K/V go to host DRAM as soon as they exist; its
// queries attend to itself (causal) and then to every earlier chunk, whose K/V come back from host through two
// buffers (the copy of chunk j waits until the block two steps back has released its buffer); then the partial
// outputs are merged. Backward, FPDT's order: outer loop over kv chunk i (K_i, V_i and fp32 dK_i, dV_i stay in
// HBM), inner loop over query chunks j >= i, with q, o, lse, dO and the fp32 dq of chunk j streamed in and dq
// streamed back out. Where the executors run it (LayerSplit::executable_fpdt), each block is one chunk pair of
// the rank's head group and each copy says it streams FPDT's buffers (sim::OpCode::fpdt_buffers).
void LayerEmitter::fpdt_attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute) {
  const int u = split_.fpdt_chunks;
  const auto c = fpdt_chunk(model_, split_);
  const auto chunk_tokens = static_cast<std::int64_t>(c.tokens) / split_.sequences;
  const int shards = split_.ulysses;
  const bool executable = split_.executable_fpdt() && (shards == 1 || executable_ulysses());
  const auto heads = static_cast<std::int32_t>(split_.sequences * model_.heads / shards);
  const auto kv_heads = static_cast<std::int32_t>(split_.sequences * local_kv_heads(model_, shards));
  const auto head_dim = static_cast<std::int32_t>(model_.head_dim);
  const FpdtCopySizes sizes = fpdt_copy_sizes(model_, split_);
  const auto kv_bytes = std::max<std::int64_t>(1, static_cast<std::int64_t>(sizes.kv_bytes));
  const auto pair_in = std::max<std::int64_t>(1, static_cast<std::int64_t>(sizes.pair_in_bytes));
  const auto pair_out = std::max<std::int64_t>(1, static_cast<std::int64_t>(sizes.pair_out_bytes));
  // Rank r's op on its head group of the chunks (after the Ulysses exchange, it holds that group of every chunk).
  auto in_head_group = [&](sim::Op o, std::size_t r) {
    if (shards > 1) {
      o.head_group = static_cast<std::int8_t>(r);
      o.head_groups = static_cast<std::uint8_t>(shards);
    }
    return o;
  };
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    const sim::DeviceId gpu = ranks_[r];
    auto block = [&](std::int32_t q, std::int32_t kv, std::vector<sim::TaskId> deps) {
      if (last[r] >= 0) deps.push_back(last[r]);
      const sim::Op pair = sim::Op::kv_range(backward ? sim::OpCode::attn_bwd : sim::OpCode::attn, at_.seq, at_.layer, q, kv, kv);
      last[r] = graph_.add(name + " C" + std::to_string(q) + " x C" + std::to_string(kv),
                           {gpu,
                            {sim::StreamKind::compute, 0},
                            recompute,
                            sim::Attention{chunk_tokens, chunk_tokens, heads, std::min(kv_heads, heads), head_dim, q == kv, backward},
                            executable ? in_head_group(pair, r) : sim::Op{}},
                           deps);
      return last[r];
    };
    auto copy = [&](const std::string& label, sim::Copy::Direction dir, std::int64_t bytes, std::vector<sim::TaskId> deps) {
      const sim::TaskId id = graph_.copy(name + " " + label, gpu, {dir, bytes, true}, deps);
      if (executable) graph_.set_op(id, op(sim::OpCode::fpdt_buffers));
      return id;
    };
    const sim::TaskId start = last[r];
    const std::vector<sim::TaskId> after_start = start >= 0 ? std::vector<sim::TaskId>{start} : std::vector<sim::TaskId>{};
    if (!backward) {
      std::vector<sim::TaskId> offloaded;
      for (int i = 0; i < u; ++i) {
        offloaded.push_back(copy("D2H kv C" + std::to_string(i), sim::Copy::Direction::d2h, kv_bytes, after_start));
        std::vector<sim::TaskId> blocks{block(i, i, {})};
        for (int j = 0; j < i; ++j) {
          std::vector<sim::TaskId> deps{offloaded[j]};
          if (blocks.size() >= 2) deps.push_back(blocks[blocks.size() - 2]);  // two buffers
          const sim::TaskId in = copy("H2D kv C" + std::to_string(j) + " for C" + std::to_string(i), sim::Copy::Direction::h2d, kv_bytes, deps);
          blocks.push_back(block(i, j, {in}));
        }
      }
    } else {
      for (int i = u - 1; i >= 0; --i) {
        const sim::TaskId kv_in = copy("H2D kv C" + std::to_string(i), sim::Copy::Direction::h2d, kv_bytes,
                                       last[r] >= 0 ? std::vector<sim::TaskId>{last[r]} : after_start);
        std::vector<sim::TaskId> blocks;
        for (int j = i; j < u; ++j) {
          std::vector<sim::TaskId> deps{kv_in};
          if (blocks.size() >= 2) deps.push_back(blocks[blocks.size() - 2]);
          const std::string pair = "C" + std::to_string(j) + " for C" + std::to_string(i);  // names unique per GPU: compare matches by them
          const sim::TaskId in = copy("H2D q o dO lse dq " + pair, sim::Copy::Direction::h2d, pair_in, deps);
          blocks.push_back(block(j, i, {in}));
          copy("D2H dq " + pair, sim::Copy::Direction::d2h, pair_out, {blocks.back()});
        }
      }
    }
  }
  if (backward) return;  // dQ and the dK | dV accumulators are fp32 until rope_bwd turns them to bf16
  const auto before = static_cast<sim::TaskId>(graph_.size());
  elementwise(name + " merge", executable ? sim::OpCode::attn_merge : sim::OpCode::none,
              kBf16 * static_cast<double>(split_.local_tokens() * model_.q_dim()) * 2,
              kBf16 * static_cast<double>(split_.local_tokens() * model_.q_dim()), last, recompute);
  for (std::size_t r = 0; r < ranks_.size() && executable; ++r) {  // every chunk's outputs of the rank's head group
    graph_.set_op(before + static_cast<sim::TaskId>(r), in_head_group(sim::Op::chunk_run(op(sim::OpCode::attn_merge), 0, u), r));
  }
}

void LayerEmitter::ulysses_exchange(const std::string& name, sim::OpCode code, double bytes, std::vector<sim::TaskId>& last) {
  if (ulysses_group_ < 0) return;
  emit_collective(graph_, name, sim::CollectiveOp::all_to_all, bytes, ulysses_group_, split_.ulysses, last, 0, last.size());
  if (!executable_ulysses()) return;
  graph_.set_op(last.front(), heads_exchange_op(code));
}

sim::Op LayerEmitter::heads_exchange_op(sim::OpCode code) const {
  sim::Op o = op(code);  // zigzag (a2a CP): each member's chunk and its mirror
  o.chunk = -1;
  o.head_groups = static_cast<std::uint8_t>(executable_heads_split());
  return o;
}

// The tensor-parallel collective of each cp slice, over that slice's TP group (under symmetry, its built ranks
// running the whole group's ring).
void LayerEmitter::collective(const std::string& name, sim::CollectiveOp op, double bytes, std::vector<sim::TaskId>& last, sim::OpCode code) {
  TRAINYARD_CHECK(join_.empty(), "a collective right after a GEMM run beside another collective");
  const std::int32_t ring_ranks = split_.built_tp() < split_.tp ? split_.tp : 0;
  for (int c = 0; c < static_cast<int>(tp_groups_.size()); ++c) {
    emit_collective(graph_, split_.built_cp() > 1 ? name + " cp" + std::to_string(c) : name, op, bytes, tp_groups_[c], split_.tp, last,
                    rank_index(c, 0), static_cast<std::size_t>(split_.built_tp()), ring_ranks);
    if (code != sim::OpCode::none) graph_.set_op(last[rank_index(c, 0)], on_rank(this->op(code), rank_index(c, 0)));
  }
}

void LayerEmitter::embedding_sum(const std::string& name, sim::Op at, std::vector<sim::TaskId>& last) {
  const double bytes = kBf16 * static_cast<double>(split_.local_tokens() * model_.hidden);
  const sim::Op saved = std::exchange(at_, on_rank(at, 0));
  if (split_.sequence_parallel) {
    collective(name + " rs", sim::CollectiveOp::reduce_scatter, bytes, last, sim::OpCode::tp_sum_x);
  } else {
    collective(name + " ar", sim::CollectiveOp::all_reduce, bytes, last, sim::OpCode::tp_sum_x);
  }
  at_ = saved;
}

void LayerEmitter::embedding_gather(const std::string& name, sim::Op at, std::vector<sim::TaskId>& last) {
  if (!split_.sequence_parallel) return;
  const sim::Op saved = std::exchange(at_, on_rank(at, 0));
  collective(name + " dx ag", sim::CollectiveOp::all_gather, kBf16 * static_cast<double>(split_.local_tokens() * model_.hidden), last,
             sim::OpCode::tp_gather_dx);
  at_ = saved;
}

void LayerEmitter::norm_gradients_sum(const std::string& name, std::int64_t first_layer, std::int64_t last_layer, bool head,
                                      std::vector<sim::TaskId>& last) {
  if (!split_.sequence_parallel) return;
  const std::int64_t norms = 2 * (last_layer - first_layer + 1) + (head ? 1 : 0);
  const sim::Op saved = std::exchange(at_,
                                      sim::Op::norm_gradients(static_cast<std::int32_t>(first_layer), static_cast<std::int32_t>(last_layer), head));
  collective(name, sim::CollectiveOp::all_reduce, 4.0 * static_cast<double>(norms * model_.hidden), last, sim::OpCode::tp_sum_norms);
  at_ = saved;
}

void LayerEmitter::vocab_parallel_loss(const std::string& tag, std::int64_t tokens, std::int64_t vocab_shard, sim::Op at, const LossMemory& memory,
                                       std::vector<sim::TaskId>& last) {
  const std::int64_t h = model_.hidden, chunk_tokens = memory.chunk_tokens > 0 ? memory.chunk_tokens : std::max<std::int64_t>(tokens, 1);
  const bool sp = split_.sequence_parallel;
  const sim::Op saved = std::exchange(at_, on_rank(sim::Op::vocab_parallel(at, split_.tp), 0));
  if (sp) collective("F loss " + tag + " ag", sim::CollectiveOp::all_gather, kBf16 * static_cast<double>(tokens * h), last, sim::OpCode::tp_gather_x);
  auto on_ranks = [&](const std::string& name, const sim::TaskParams& params, sim::OpCode code) {
    each_rank(name, params, last, false, code);
    for (std::size_t r = 0; r < ranks_.size(); ++r) graph_.set_op(last[r], on_rank(op(code), r));
  };
  for (std::int64_t c0 = 0; c0 < tokens; c0 += chunk_tokens) {
    const std::int64_t c = std::min(chunk_tokens, tokens - c0);
    const std::string name = "F loss " + tag + " tokens " + std::to_string(c0);
    at_.row_begin = static_cast<std::int32_t>(c0);
    at_.row_end = static_cast<std::int32_t>(c0 + c);
    std::vector<sim::TaskId> logits(ranks_.size());
    const auto logit_bytes = static_cast<std::int64_t>(static_cast<double>(c * vocab_shard) * memory.bytes_per_logit);
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      logits[r] = last[r] = graph_.alloc(name + " logits", ranks_[r], sim::Pool::hbm, logit_bytes, "fp32 logits chunk " + tag,
                                         last[r] >= 0 ? std::vector<sim::TaskId>{last[r]} : std::vector<sim::TaskId>{});
    }
    on_ranks(name + " lm_head", sim::Gemm{c, vocab_shard, h, hw::Dtype::bf16}, sim::OpCode::head_logits);
    on_ranks(name + " xent shard", sim::Elementwise{c * vocab_shard * 2, c * 8}, sim::OpCode::head_xent_shard);
    collective(name + " xent ag", sim::CollectiveOp::all_gather, static_cast<double>(c * 8 * split_.tp), last, sim::OpCode::tp_gather_xent);
    on_ranks(name + " xent merge", sim::Elementwise{c * vocab_shard * 2 + c * 8 * split_.tp, c * vocab_shard * 2}, sim::OpCode::head_xent_merge);
    on_ranks(name + " lm_head dgrad", sim::Gemm{c, h, vocab_shard, hw::Dtype::bf16}, sim::OpCode::head_dgrad_shard);
    const double dnf_bytes = kBf16 * static_cast<double>(c * h);
    if (sp) {
      collective(name + " dgrad rs", sim::CollectiveOp::reduce_scatter, dnf_bytes, last, sim::OpCode::tp_sum_dnf);
    } else {
      collective(name + " dgrad ar", sim::CollectiveOp::all_reduce, dnf_bytes, last, sim::OpCode::tp_sum_dnf);
    }
    on_ranks(name + " final norm bwd", sim::Elementwise{4 * c * h, 2 * c * h}, sim::OpCode::head_norm_bwd);
    on_ranks(name + " lm_head wgrad", sim::Gemm{h, vocab_shard, c, hw::Dtype::bf16}, sim::OpCode::head_wgrad);
    for (std::size_t r = 0; r < ranks_.size(); ++r) last[r] = graph_.free(name + " free logits", logits[r], std::vector<sim::TaskId>{last[r]});
  }
  at_ = saved;
}

// Transformer Engine's overlap (Megatron's --tp-comm-overlap) pipelines the GEMM with the collective chunk by
// chunk (forward: ring-exchange all-gather into the GEMM, the GEMM into a pipelined reduce-scatter; backward:
// the input's all-gather beside the dgrad GEMM, the dgrad's reduce-scatter beside the wgrad GEMM). Modelled as
// the two running side by side: max(GEMM, collective), sharing SMs and links as the engine shares them; the
// chunk that cannot overlap (1/tp of the longer one) is not charged.
void LayerEmitter::gemm_beside_collective(const std::string& gemm_name, sim::OpCode code, std::int64_t m, std::int64_t n, std::int64_t k,
                                          const std::string& collective_name, sim::CollectiveOp op, double bytes, bool gather_first,
                                          std::vector<sim::TaskId>& last, bool recompute, sim::OpCode collective_code) {
  if (!split_.tp_comm_overlap) {
    if (gather_first) collective(collective_name, op, bytes, last, collective_code);
    gemm(gemm_name, code, m, n, k, last, recompute);
    if (!gather_first) collective(collective_name, op, bytes, last, collective_code);
    return;
  }
  // A collective still beside the previous GEMM (the backward's input all-gather beside dX) is what this GEMM
  // (dW) waits for; this one (dX's reduce-scatter) starts after that GEMM alone.
  std::vector<sim::TaskId> waited = std::exchange(join_, {});
  std::vector<sim::TaskId> beside = last;
  collective(collective_name, op, bytes, beside, collective_code);
  join_ = std::move(waited);
  gemm(gemm_name, code, m, n, k, last, recompute);
  join_ = std::move(beside);
}

void LayerEmitter::forward(const std::string& p, std::vector<sim::TaskId>& last, bool recompute) {
  const std::int64_t s = split_.local_tokens();
  const std::int64_t h = model_.hidden, t = split_.tp;
  const double local = split_.sequence_parallel ? static_cast<double>(s) / static_cast<double>(t) : static_cast<double>(s);
  const double hidden_bytes = kBf16 * static_cast<double>(s * h);  // the full b*S*h activation
  const double hd = static_cast<double>(h);
  const std::int64_t q = model_.q_dim() / t, kv = local_kv_heads(model_, split_.tp) * model_.head_dim;
  const std::int64_t f = model_.ffn_hidden / t;
  const bool sp = split_.sequence_parallel;
  const bool swiglu = model_.activation == model::Activation::swiglu;

  const auto reduce = sp ? sim::CollectiveOp::reduce_scatter : sim::CollectiveOp::all_reduce;
  elementwise(p + " norm1", sim::OpCode::norm1, kBf16 * local * hd, kBf16 * local * hd, last, recompute);
  if (sp) {
    gemm_beside_collective(p + " qkv", sim::OpCode::qkv, s, q + 2 * kv, h, p + " ag1", sim::CollectiveOp::all_gather, hidden_bytes, true, last,
                           recompute, sim::OpCode::tp_gather_n1);
  } else {
    gemm(p + " qkv", sim::OpCode::qkv, s, q + 2 * kv, h, last, recompute);
  }
  elementwise(p + " rope", sim::OpCode::rope, kBf16 * static_cast<double>(s * (q + kv)), kBf16 * static_cast<double>(s * (q + kv)), last, recompute);
  ulysses_exchange(p + " a2a qkv", sim::OpCode::heads_qkv, kBf16 * static_cast<double>(s * (q + 2 * kv)), last);
  attention(p + " attn", false, last, recompute);
  ulysses_exchange(p + " a2a out", sim::OpCode::heads_out, kBf16 * static_cast<double>(s * q), last);
  gemm_beside_collective(p + " proj", sim::OpCode::proj, s, h, q, p + (sp ? " rs1" : " ar1"), reduce, hidden_bytes, false, last, recompute,
                         sim::OpCode::tp_sum_p);
  elementwise(p + " residual1", sim::OpCode::residual1, 2 * kBf16 * local * hd, kBf16 * local * hd, last, recompute);
  elementwise(p + " norm2", sim::OpCode::norm2, kBf16 * local * hd, kBf16 * local * hd, last, recompute);
  if (sp) {
    gemm_beside_collective(p + " mlp_up", sim::OpCode::mlp_up, s, swiglu ? 2 * f : f, h, p + " ag2", sim::CollectiveOp::all_gather, hidden_bytes,
                           true, last, recompute, sim::OpCode::tp_gather_n2);
  } else {
    gemm(p + " mlp_up", sim::OpCode::mlp_up, s, swiglu ? 2 * f : f, h, last, recompute);
  }
  elementwise(p + " act", sim::OpCode::act, kBf16 * static_cast<double>(s * (swiglu ? 2 * f : f)), kBf16 * static_cast<double>(s * f), last,
              recompute);
  gemm_beside_collective(p + " mlp_down", sim::OpCode::mlp_down, s, h, f, p + (sp ? " rs2" : " ar2"), reduce, hidden_bytes, false, last, recompute,
                         sim::OpCode::tp_sum_mo);
  elementwise(p + " residual2", sim::OpCode::residual2, 2 * kBf16 * local * hd, kBf16 * local * hd, last, recompute);
  TRAINYARD_CHECK(join_.empty(), "a collective run beside a GEMM that nothing waits for");
}

// Each GEMM's backward is two GEMMs (input gradient, weight gradient); elementwise backward reads the saved
// input and the incoming gradient and writes one gradient; the TP collectives mirror the forward's.
void LayerEmitter::backward(const std::string& p, std::vector<sim::TaskId>& last) {
  const std::int64_t s = split_.local_tokens();
  const std::int64_t h = model_.hidden, t = split_.tp;
  const double local = split_.sequence_parallel ? static_cast<double>(s) / static_cast<double>(t) : static_cast<double>(s);
  const double hidden_bytes = kBf16 * static_cast<double>(s * h);
  const double hd = static_cast<double>(h);
  const std::int64_t q = model_.q_dim() / t, kv = local_kv_heads(model_, split_.tp) * model_.head_dim;
  const std::int64_t f = model_.ffn_hidden / t;
  const std::int64_t up = model_.activation == model::Activation::swiglu ? 2 * f : f;
  const bool sp = split_.sequence_parallel;
  const auto reduce = sp ? sim::CollectiveOp::reduce_scatter : sim::CollectiveOp::all_reduce;
  // A GEMM Y = X W (X: m x k, W: k x n) has two backward GEMMs, dX = dY W^T and dW = X^T dY. With sequence
  // parallelism (Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication) a row-parallel GEMM's dY arrives
  // sequence-split and is all-gathered before dX (the forward reduce-scatter's transpose); a column-parallel GEMM
  // kept only its rank's rows of X, so X is all-gathered again beside dX for dW, and dX is reduce-scattered beside dW.
  auto dgrad = [&](const std::string& name, sim::OpCode code, std::int64_t m, std::int64_t n, std::int64_t k, const std::string& gather_name,
                   sim::OpCode gathers) {
    if (!sp) return gemm(name + " dgrad", code, m, k, n, last, false);
    gemm_beside_collective(name + " dgrad", code, m, k, n, gather_name, sim::CollectiveOp::all_gather, hidden_bytes, true, last, false, gathers);
  };
  auto wgrad = [&](const std::string& name, sim::OpCode dgrad_code, std::int64_t m, std::int64_t n, std::int64_t k) {
    gemm(name + " wgrad", static_cast<sim::OpCode>(static_cast<int>(dgrad_code) + 1), k, n, m, last, false);
  };
  auto wgrad_then_reduce = [&](const std::string& name, sim::OpCode dgrad_code, std::int64_t m, std::int64_t n, std::int64_t k,
                               const std::string& reduce_name, sim::OpCode sums) {
    gemm_beside_collective(name + " wgrad", static_cast<sim::OpCode>(static_cast<int>(dgrad_code) + 1), k, n, m, reduce_name, reduce, hidden_bytes,
                           false, last, false, sums);
  };
  elementwise(p + " residual2 bwd", sim::OpCode::residual2_bwd, kBf16 * local * hd, 2 * kBf16 * local * hd, last, false);
  dgrad(p + " mlp_down", sim::OpCode::mlp_down_dgrad, s, h, f, p + " ag2 bwd", sim::OpCode::tp_gather_dm);
  wgrad(p + " mlp_down", sim::OpCode::mlp_down_dgrad, s, h, f);
  elementwise(p + " act bwd", sim::OpCode::act_bwd, kBf16 * static_cast<double>(s * (up + f)), kBf16 * static_cast<double>(s * up), last, false);
  dgrad(p + " mlp_up", sim::OpCode::mlp_up_dgrad, s, up, h, p + " ag2 input bwd", sim::OpCode::tp_gather_n2);
  wgrad_then_reduce(p + " mlp_up", sim::OpCode::mlp_up_dgrad, s, up, h, p + (sp ? " rs2 bwd" : " ar2 bwd"), sim::OpCode::tp_sum_dn2);
  elementwise(p + " norm2 bwd", sim::OpCode::norm2_bwd, 2 * kBf16 * local * hd, kBf16 * local * hd, last, false);
  elementwise(p + " residual1 bwd", sim::OpCode::residual1_bwd, kBf16 * local * hd, 2 * kBf16 * local * hd, last, false);
  dgrad(p + " proj", sim::OpCode::proj_dgrad, s, h, q, p + " ag1 bwd", sim::OpCode::tp_gather_dp);
  wgrad(p + " proj", sim::OpCode::proj_dgrad, s, h, q);
  ulysses_exchange(p + " a2a dout", sim::OpCode::heads_dout, kBf16 * static_cast<double>(s * q), last);
  if (split_.recompute_attention) attention(p + " attn recompute", false, last, true);
  attention(p + " attn bwd", true, last, false);
  ulysses_exchange(p + " a2a dqkv", sim::OpCode::heads_dqkv, kBf16 * static_cast<double>(s * (q + 2 * kv)), last);
  elementwise(p + " rope bwd", sim::OpCode::rope_bwd, kBf16 * static_cast<double>(s * (q + kv)), kBf16 * static_cast<double>(s * (q + kv)), last,
              false);
  dgrad(p + " qkv", sim::OpCode::qkv_dgrad, s, q + 2 * kv, h, p + " ag1 input bwd", sim::OpCode::tp_gather_n1);
  wgrad_then_reduce(p + " qkv", sim::OpCode::qkv_dgrad, s, q + 2 * kv, h, p + (sp ? " rs1 bwd" : " ar1 bwd"), sim::OpCode::tp_sum_dn1);
  elementwise(p + " norm1 bwd", sim::OpCode::norm1_bwd, 2 * kBf16 * local * hd, kBf16 * local * hd, last, false);
  TRAINYARD_CHECK(join_.empty(), "a collective run beside a GEMM that nothing waits for");
}

namespace {
std::vector<sim::TaskId> after_of(sim::TaskId after) { return after >= 0 ? std::vector<sim::TaskId>{after} : std::vector<sim::TaskId>{}; }
}  // namespace

sim::TaskId emit_embedding(sim::TaskGraph& g, sim::DeviceId gpu, const std::string& name, std::int64_t tokens, std::int64_t hidden, bool backward,
                           sim::TaskId after, sim::Op at) {
  const std::int64_t read = backward ? 4 * tokens * hidden : 8 * tokens;  // ids, or gradient + table rows
  const sim::TaskId id = g.elementwise(name, gpu, {read, 2 * tokens * hidden}, after_of(after));
  at.code = backward ? sim::OpCode::embed_bwd : sim::OpCode::embed;
  at.layer = 0;
  return g.set_op(id, at);
}

LossMemory loss_memory(const stacks::StackProfile& stack) {
  if (!stack.loss_logits.whole_micro_batch) return {};
  return {0, stack.loss_logits.bytes_per_logit.value};
}

sim::TaskId emit_loss(sim::TaskGraph& g, sim::DeviceId gpu, const std::string& tag, std::int64_t tokens, std::int64_t hidden,
                      std::int64_t vocab_shard, sim::TaskId after, sim::Op coordinates, const LossMemory& memory) {
  const std::int64_t chunk_tokens = memory.chunk_tokens > 0 ? memory.chunk_tokens : std::max<std::int64_t>(tokens, 1);
  sim::TaskId at = after;
  auto piece = [&](sim::OpCode code, std::int64_t first, std::int64_t count) {
    sim::Op o = coordinates;
    o.code = code;
    o.row_begin = static_cast<std::int32_t>(first);
    o.row_end = static_cast<std::int32_t>(first + count);
    g.set_op(at, o);
  };
  for (std::int64_t c0 = 0; c0 < tokens; c0 += chunk_tokens) {
    const std::int64_t c = std::min(chunk_tokens, tokens - c0);
    const std::string name = "F loss " + tag + " tokens " + std::to_string(c0);
    const auto logit_bytes = static_cast<std::int64_t>(static_cast<double>(c * vocab_shard) * memory.bytes_per_logit);
    const sim::TaskId logits = g.alloc(name + " logits", gpu, sim::Pool::hbm, logit_bytes, "fp32 logits chunk " + tag, after_of(at));
    at = g.gemm(name + " lm_head", gpu, {c, vocab_shard, hidden, hw::Dtype::bf16}, std::vector<sim::TaskId>{logits});
    piece(sim::OpCode::head_logits, c0, c);
    at = g.elementwise(name + " softmax xent", gpu, {c * vocab_shard * 4, c * vocab_shard * 2}, std::vector<sim::TaskId>{at});
    piece(sim::OpCode::head_xent, c0, c);
    at = g.gemm(name + " lm_head dgrad", gpu, {c, hidden, vocab_shard, hw::Dtype::bf16}, std::vector<sim::TaskId>{at});
    piece(sim::OpCode::head_dgrad, c0, c);
    at = g.gemm(name + " lm_head wgrad", gpu, {hidden, vocab_shard, c, hw::Dtype::bf16}, std::vector<sim::TaskId>{at});
    piece(sim::OpCode::head_wgrad, c0, c);
    at = g.free(name + " free logits", logits, std::vector<sim::TaskId>{at});  // what follows waits for it, as in vocab_parallel_loss
  }
  return at;
}

}  // namespace trainyard::planner
