#include "planner/ringtrack.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>

#include "common/error.hpp"
#include "common/units.hpp"
#include "planner/transformer.hpp"

namespace trainyard::planner {

namespace {

constexpr double kBf16 = 2, kFp32 = 4;
constexpr int kSendStream = 0, kReduceStream = 2;
constexpr int kExhaustiveRingLimit = 9;

std::int64_t bytes(double b) { return std::max<std::int64_t>(1, static_cast<std::int64_t>(b)); }
std::vector<sim::TaskId> ids(std::initializer_list<sim::TaskId> list) {
  std::vector<sim::TaskId> out;
  for (auto id : list) {
    if (id >= 0) out.push_back(id);
  }
  return out;
}


// The order in which each GPU runs its visits (its compute stream is in order, so this order is the schedule):
// a list schedule of the train with estimated visit costs. Forward, a visit is ready once its chunk has left
// the previous stage and the previous chunk has left this stage. When a GPU is free it runs, of the visits ready
// by then, the one of the deepest stage (the oldest chunk, which keeps the train moving); when none is ready it
// waits for the earliest. GPUs are served in the order of those start times. Backward is the mirror image
// (stages and chunks descending). Returned as one global sequence consistent with every GPU's.
// `cost(stage, chunk)` is a template parameter, not a std::function: this loop runs (stages x chunks x stages)
// times for every ring-track candidate the planner bounds.
template <typename Cost>
std::vector<Visit> train_order(int stages, int chunks, const std::vector<int>& stage_position, int positions, bool backward, const Cost& cost) {
  std::vector<int> next(static_cast<std::size_t>(stages), backward ? chunks - 1 : 0);  // per stage, next chunk
  std::vector<double> stage_free(static_cast<std::size_t>(stages), 0);               // when its previous chunk ended
  std::vector<std::vector<double>> finish(static_cast<std::size_t>(stages), std::vector<double>(static_cast<std::size_t>(chunks), -1));
  std::vector<double> gpu_free(static_cast<std::size_t>(positions), 0);
  std::vector<Visit> order;
  const auto total = static_cast<std::size_t>(stages * chunks);
  std::vector<int> pick(static_cast<std::size_t>(positions));
  std::vector<double> pick_start(static_cast<std::size_t>(positions));
  order.reserve(total);
  while (order.size() < total) {
    // Per position: the visit it runs next and when.
    std::fill(pick.begin(), pick.end(), -1);
    std::fill(pick_start.begin(), pick_start.end(), 0.0);
    for (int s = 0; s < stages; ++s) {
      const int k = next[static_cast<std::size_t>(s)];
      if (k < 0 || k >= chunks) continue;
      double ready = stage_free[static_cast<std::size_t>(s)];
      const int upstream = backward ? s + 1 : s - 1;
      if (upstream >= 0 && upstream < stages) {
        const double at = finish[static_cast<std::size_t>(upstream)][static_cast<std::size_t>(k)];
        if (at < 0) continue;
        ready = std::max(ready, at);
      }
      const auto pos = static_cast<std::size_t>(stage_position[static_cast<std::size_t>(s)]);
      const double start = std::max(ready, gpu_free[pos]);
      const int cur = pick[pos];
      const bool deeper = cur >= 0 && (backward ? s < cur : s > cur);
      // "Ready" allows a wait of a quarter visit: the estimates are not exact, and a near-tie should go to the
      // older chunk rather than to whichever estimate came out a hair earlier.
      const double slack = 0.25 * cost(s, k);
      const bool both_ready = cur >= 0 && start <= gpu_free[pos] + slack && pick_start[pos] <= gpu_free[pos] + slack;
      if (cur < 0 || (both_ready ? deeper : start < pick_start[pos] || (start == pick_start[pos] && deeper))) {
        pick[pos] = s;
        pick_start[pos] = start;
      }
    }
    int best = -1;
    double best_start = 0;
    for (int pos = 0; pos < positions; ++pos) {
      if (pick[static_cast<std::size_t>(pos)] >= 0 && (best < 0 || pick_start[static_cast<std::size_t>(pos)] < best_start)) {
        best = pick[static_cast<std::size_t>(pos)];
        best_start = pick_start[static_cast<std::size_t>(pos)];
      }
    }
    TRAINYARD_CHECK(best >= 0, "the train always has a visit that can run");
    const int k = next[static_cast<std::size_t>(best)];
    const double end = best_start + cost(best, k);
    finish[static_cast<std::size_t>(best)][static_cast<std::size_t>(k)] = end;
    stage_free[static_cast<std::size_t>(best)] = end;
    gpu_free[static_cast<std::size_t>(stage_position[static_cast<std::size_t>(best)])] = end;
    next[static_cast<std::size_t>(best)] += backward ? -1 : 1;
    order.push_back({best, k});
  }
  return order;
}

}  // namespace

// --- ring order ------------------------------------------------------------------------------------------------

namespace {

// Routes between GPUs of a ring, computed once per pair (the order search scores thousands of cycles).
class HopScorer {
 public:
  explicit HopScorer(const sim::Cluster& cluster) : cluster_(cluster) {}

  // The hops of a cyclic order: each hop's bandwidth with every hop of the ring active at once, hops that share a
  // link direction sharing its bandwidth (a half-duplex link counts both directions together).
  std::vector<RingHop> hops(const std::vector<int>& order) {
    const auto& graph = cluster_.topology.graph();
    const std::size_t n = order.size();
    load_.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const hw::Route& r = route(order[i], order[(i + 1) % n]);
      for (std::size_t j = 0; j < r.links.size(); ++j) ++load_[key(r, j)];
    }
    std::vector<RingHop> out;
    for (std::size_t i = 0; i < n; ++i) {
      const hw::Route& r = route(order[i], order[(i + 1) % n]);
      double gbps = r.bottleneck_gbps;
      for (std::size_t j = 0; j < r.links.size(); ++j) gbps = std::min(gbps, graph[r.links[j]].gbps_per_direction / load_[key(r, j)]);
      out.push_back({order[i], order[(i + 1) % n], gbps});
    }
    return out;
  }

 private:
  const hw::Route& route(int a, int b) {
    auto [it, inserted] = routes_.try_emplace({a, b});
    if (inserted) {
      const auto& topo = cluster_.topology;
      const int per_node = topo.gpus_per_node();
      it->second = topo.route(topo.gpu(a / per_node, a % per_node), topo.gpu(b / per_node, b % per_node));
    }
    return it->second;
  }
  std::pair<int, int> key(const hw::Route& r, std::size_t i) const {
    const auto& link = cluster_.topology.graph()[r.links[i]];
    return {link.index, link.full_duplex ? static_cast<int>(r.vertices[i] < r.vertices[i + 1]) : 2};
  }

  const sim::Cluster& cluster_;
  std::map<std::pair<int, int>, hw::Route> routes_;
  std::map<std::pair<int, int>, int> load_;
};

}  // namespace

std::vector<RingHop> ring_hops(const sim::Cluster& cluster, const std::vector<int>& order) { return HopScorer(cluster).hops(order); }

std::vector<int> best_ring_order(const sim::Cluster& cluster, const std::vector<int>& members) {
  if (members.size() <= 2) return members;
  const int per_node = cluster.topology.gpus_per_node();
  HopScorer scorer(cluster);
  struct Score {
    double slowest = 0;
    int crossings = 0;
    double seconds_per_gb = 0;
  };
  auto score = [&](const std::vector<int>& order) {
    Score s;
    const auto hops = scorer.hops(order);
    s.slowest = hops.front().gbps;
    for (const auto& h : hops) {
      s.slowest = std::min(s.slowest, h.gbps);
      s.crossings += h.from / per_node != h.to / per_node;
      s.seconds_per_gb += 1.0 / h.gbps;
    }
    return s;
  };
  auto better = [](const Score& a, const Score& b) {
    if (a.slowest != b.slowest) return a.slowest > b.slowest * (1 + 1e-9);
    if (a.crossings != b.crossings) return a.crossings < b.crossings;
    return a.seconds_per_gb < b.seconds_per_gb * (1 - 1e-9);
  };
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.size() <= static_cast<std::size_t>(kExhaustiveRingLimit)) {
    // Cycles: fix the first member, try every order of the rest (lexicographic, so ties keep the smallest).
    std::vector<int> order = sorted, best = sorted;
    Score best_score = score(best);
    while (std::next_permutation(order.begin() + 1, order.end())) {
      const Score s = score(order);
      if (better(s, best_score)) {
        best = order;
        best_score = s;
      }
    }
    return best;
  }
  // Large rings: nodes in order (one crossing per node boundary), a greedy fastest-next-hop chain in each node.
  std::vector<int> order;
  std::map<int, std::vector<int>> by_node;
  for (int g : sorted) by_node[g / per_node].push_back(g);
  for (auto& [node, gpus] : by_node) {
    std::vector<int> left = gpus;
    int at = left.front();
    left.erase(left.begin());
    order.push_back(at);
    while (!left.empty()) {
      std::size_t pick = 0;
      double pick_gbps = -1;
      for (std::size_t i = 0; i < left.size(); ++i) {
        const double gbps = scorer.hops({at, left[i]}).front().gbps;
        if (gbps > pick_gbps) {
          pick = i;
          pick_gbps = gbps;
        }
      }
      at = left[pick];
      left.erase(left.begin() + static_cast<std::ptrdiff_t>(pick));
      order.push_back(at);
    }
  }
  return order;
}

std::string RingTrackPlan::describe() const {
  std::ostringstream out;
  if (rings.empty()) return "";
  const auto& ring = rings.front();
  for (std::size_t i = 0; i < ring.size(); ++i) out << (i ? " -> " : "") << "gpu" << ring[i];
  if (ring.size() > 1) {
    double slowest = hops.front().gbps;
    for (const auto& h : hops) slowest = std::min(slowest, h.gbps);
    out << " -> gpu" << ring.front() << " (slowest hop " << format_fixed(slowest, 1) << " GB/s)";
  }
  if (rings.size() > 1) out << "; " << rings.size() << " data-parallel replicas of this ring";
  return out.str();
}

// --- the order of the train -------------------------------------------------------------------------------------

std::vector<int> stage_positions(std::int64_t layers, const RingTrackParams& p) {
  const int L = static_cast<int>(layers);
  std::vector<int> out(static_cast<std::size_t>(L + 1));
  for (int l = 0; l < L; ++l) out[static_cast<std::size_t>(l)] = (l / p.block) % p.ring;
  out[static_cast<std::size_t>(L)] = ((L - 1) / p.block + 1) % p.ring;
  return out;
}

std::vector<int> layers_per_position(const std::vector<int>& stage_positions, int ring) {
  std::vector<int> out(static_cast<std::size_t>(ring), 0);
  for (std::size_t l = 0; l + 1 < stage_positions.size(); ++l) ++out[static_cast<std::size_t>(stage_positions[l])];
  return out;
}

TrainSchedule train_schedule(const model::ModelConfig& model, const RingTrackParams& p, std::int64_t seq_len) {
  const int L = static_cast<int>(model.layers);
  const int C = static_cast<int>(seq_len / p.chunk);
  const double c = static_cast<double>(p.chunk);
  TrainSchedule t;
  t.stage_position = stage_positions(model.layers, p);
  // Visit costs for ordering the train, in FLOPs: the dense ops of a chunk, its attention against itself and the
  // earlier chunks (growing with k), backward twice forward plus what recompute runs again; the head stage is the
  // LM head and loss (forward, input gradient and weight gradient GEMMs).
  const double dense_flops = 2 * model.param_counts().per_layer() * c;
  auto attention_flops = [&](int k) { return 4.0 * c * c * (k + 0.5) * static_cast<double>(model.q_dim()); };
  const bool recompute = p.acts == ActivationPolicy::recompute;
  t.forward = train_order(L, C, t.stage_position, p.ring, false, [&](int, int k) { return dense_flops + attention_flops(k); });
  t.backward = train_order(L + 1, C, t.stage_position, p.ring, true, [&](int s, int k) {
    if (s == L) return 6 * c * static_cast<double>(model.vocab * model.hidden);
    return 2 * (dense_flops + attention_flops(k)) + (recompute ? dense_flops : 0);
  });
  return t;
}

// --- checks ----------------------------------------------------------------------------------------------------

void check_ringtrack(const StepInputs& in, const RingTrackParams& p) {
  const auto& m = in.model;
  const int gpus = in.cluster.gpus();
  auto fail = [](const std::string& flag, const std::string& expected, const std::string& got) {
    throw InputError(flag, "value", expected, got);
  };
  if (p.ring < 1 || gpus % p.ring != 0) fail("--ring", "a divisor of the cluster's " + std::to_string(gpus) + " GPUs", std::to_string(p.ring));
  if (p.block < 1 || p.block > m.layers) fail("--block", "1 to the model's " + std::to_string(m.layers) + " layers", std::to_string(p.block));
  const std::int64_t blocks = (m.layers + p.block - 1) / p.block;
  if (blocks < p.ring) {
    fail("--ring", "at most the number of layer blocks (" + std::to_string(blocks) + " with --block " + std::to_string(p.block) + ")",
         std::to_string(p.ring));
  }
  if (p.chunk < 1 || in.workload.seq_len % p.chunk != 0) {
    fail("--chunk", "a chunk length dividing the sequence length (" + std::to_string(in.workload.seq_len) + ")", std::to_string(p.chunk));
  }
  if (p.prefetch < 1 || p.prefetch > 8) fail("--prefetch", "1 to 8 buffers", std::to_string(p.prefetch));
  const int replicas = gpus / std::max(1, p.ring);
  if (in.workload.global_batch % replicas != 0) {
    fail("--global-batch", "a multiple of the " + std::to_string(replicas) + " data-parallel replicas of the ring",
         std::to_string(in.workload.global_batch));
  }
  if (p.weights == WeightPolicy::stream && p.states != Placement::dram) {
    fail("--weights", "stream only with --states dram (streamed weights accumulate their gradients on the host)", "stream");
  }
  if (!p.ring_order.empty()) {
    std::vector<int> sorted = p.ring_order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> expected(static_cast<std::size_t>(p.ring));
    std::iota(expected.begin(), expected.end(), 0);
    if (sorted != expected) {
      fail("--ring-order", "a permutation of the ring positions 0.." + std::to_string(p.ring - 1), std::to_string(p.ring_order.size()) + " entries");
    }
  }
}

// --- the step ----------------------------------------------------------------------------------------------------

RingTrackPlan build_ringtrack(const StepInputs& in, const RingTrackParams& p) {
  check_ringtrack(in, p);
  const auto& model = in.model;
  const auto& pol = in.precision;
  const int gpus = in.cluster.gpus();
  const int P = p.ring;
  const int replicas = gpus / P;
  const int L = static_cast<int>(model.layers);
  const int C = static_cast<int>(in.workload.seq_len / p.chunk);
  const std::int64_t c = p.chunk, h = model.hidden;
  const std::int64_t sequences = in.workload.global_batch / replicas;

  RingTrackPlan plan;
  auto& g = plan.graph;
  // About 60 tasks per visit (the layer's ops, their buffers, copies and sends) plus the streamed K/V blocks.
  const double kv_blocks = static_cast<double>(C) * static_cast<double>(C) / (2.0 * static_cast<double>(std::max<std::int64_t>(1, p.kv_block_tokens / p.chunk)));
  g.reserve(static_cast<std::size_t>(static_cast<double>(replicas * sequences * (L + 1)) * (60.0 * C + (p.kv == Placement::dram ? 8 * kv_blocks : 0))));
  // Per GPU: the last backward task of each layer of the last sequence, and (streamed weights) the host's sums
  // of each visit's weight gradients.
  // Per GPU: the last backward task of each layer of the last sequence (then the head's and the embedding's: L + 2
  // entries), and (streamed weights) the host's sums of each visit's weight gradients.
  std::vector<std::vector<sim::TaskId>> layer_done(static_cast<std::size_t>(gpus), std::vector<sim::TaskId>(static_cast<std::size_t>(L + 2), -1));
  std::vector<std::vector<sim::TaskId>> grads_ready(static_cast<std::size_t>(gpus));
  std::vector<std::vector<sim::TaskId>> reduced(static_cast<std::size_t>(gpus));

  // Rings: replica r holds GPUs r*P .. r*P+P-1, in the chosen (or given) order.
  for (int r = 0; r < replicas; ++r) {
    std::vector<int> members(static_cast<std::size_t>(P));
    std::iota(members.begin(), members.end(), r * P);
    if (p.ring_order.empty()) {
      plan.rings.push_back(best_ring_order(in.cluster, members));
    } else {
      std::vector<int> order;
      for (int pos : p.ring_order) order.push_back(r * P + pos);
      plan.rings.push_back(order);
    }
  }
  plan.hops = P > 1 ? ring_hops(in.cluster, plan.rings.front()) : std::vector<RingHop>{};

  const TrainSchedule schedule = train_schedule(model, p, in.workload.seq_len);
  const std::vector<int>& stage_position = schedule.stage_position;
  const std::vector<Visit>& forward_order = schedule.forward;
  const std::vector<Visit>& backward_order = schedule.backward;

  // Sizes.
  LayerSplit chunk_split;
  chunk_split.seq_len = c;
  const ActivationBytes acts = layer_activation_bytes(model, chunk_split, Recompute::none);
  const double kv_chunk = kBf16 * 2 * static_cast<double>(c * model.kv_dim());  // K and V of one chunk
  const double acc_chunk = kFp32 * 2 * static_cast<double>(c * model.kv_dim());  // fp32 dK and dV
  const double kept = acts.total() - kv_chunk;                                    // everything but K and V
  const double checkpoint = kBf16 * static_cast<double>(c * h) + kBf16 * static_cast<double>(c * model.q_dim()) +
                            kFp32 * static_cast<double>(c * model.heads);  // layer input, attention output, lse
  const double hidden_chunk = kBf16 * static_cast<double>(c * h);
  const auto params = model.param_counts();
  const double layer_params = params.per_layer();
  const double embedding_params = params.embedding;
  const double head_params = static_cast<double>(model.vocab * model.hidden) + params.final_norm;
  const int span = static_cast<int>(std::max<std::int64_t>(1, (p.kv_block_tokens + c - 1) / c));  // chunks per K/V block
  const bool kv_dram = p.kv == Placement::dram;
  const bool acts_hbm = p.acts == ActivationPolicy::hbm, recompute = p.acts == ActivationPolicy::recompute;
  const bool stream_weights = p.weights == WeightPolicy::stream;
  const bool states_dram = p.states == Placement::dram;
  // Parameters each ring position holds: its layers, the embedding with layer 0, the LM head at the head's stop.
  const std::vector<int> owned_layers = layers_per_position(stage_position, P);
  std::vector<double> resident_params(static_cast<std::size_t>(P), 0), owned_params(static_cast<std::size_t>(P), 0);
  for (int pos = 0; pos < P; ++pos) {
    const auto i = static_cast<std::size_t>(pos);
    resident_params[i] = (pos == stage_position[0] ? embedding_params : 0) + (pos == stage_position[static_cast<std::size_t>(L)] ? head_params : 0);
    owned_params[i] = layer_params * owned_layers[i] + resident_params[i];
  }

  // Model states are moved and updated whole; the executor tracks them per process (sim::OpCode::states).
  auto states = [&](sim::TaskId id) { return g.set_op(id, {sim::OpCode::states}); };
  for (int r = 0; r < replicas; ++r) {
    const auto& ring = plan.rings[static_cast<std::size_t>(r)];
    auto gpu_of = [&](int stage) { return ring[static_cast<std::size_t>(stage_position[static_cast<std::size_t>(stage)])]; };
    auto host_of = [&](int gpu) { return sim::host_device(in.cluster.node_of(gpu)); };

    // Model states of each ring position.
    for (int pos = 0; pos < P; ++pos) {
      const int gpu = ring[static_cast<std::size_t>(pos)];
      const double resident = resident_params[static_cast<std::size_t>(pos)];
      const double owned = owned_params[static_cast<std::size_t>(pos)];
      const double layers = owned - resident;
      const std::string tag = " gpu" + std::to_string(gpu);
      states(g.alloc("weights" + tag, gpu, sim::Pool::hbm, bytes(pol.weight_bytes * (stream_weights ? resident : owned)), "weights"));
      if (stream_weights) states(g.alloc("host weights" + tag, host_of(gpu), sim::Pool::dram, bytes(pol.weight_bytes * layers), "streamed weights"));
      // Gradients accumulate over the chunks where the weights are (on the host when they are streamed).
      states(g.alloc("grads" + tag, gpu, sim::Pool::hbm, bytes(pol.grad_bytes * (stream_weights ? resident : owned)), "gradients"));
      if (states_dram) states(g.alloc("host grads" + tag, host_of(gpu), sim::Pool::dram, bytes(pol.grad_bytes * owned), "gradients on host"));
      states(g.alloc("optimizer" + tag, states_dram ? host_of(gpu) : gpu, states_dram ? sim::Pool::dram : sim::Pool::hbm,
              bytes((pol.master_bytes + pol.optimizer_bytes) * owned), "master weights and Adam moments"));
    }

    std::vector<sim::TaskId> gpu_last(static_cast<std::size_t>(gpus), -1);  // latest compute task per GPU
    // Per GPU: the end of each visit so far, so that buffers of visit i wait for visit i - depth to finish.
    std::vector<std::vector<sim::TaskId>> visit_ends(static_cast<std::size_t>(gpus));
    auto visit_end_back = [&](int gpu, std::size_t depth) -> sim::TaskId {
      const auto& ends = visit_ends[static_cast<std::size_t>(gpu)];
      return ends.size() >= depth ? ends[ends.size() - depth] : -1;
    };

    for (std::int64_t seq = 0; seq < sequences; ++seq) {
      const std::string seq_tag = sequences > 1 ? " s" + std::to_string(seq) : "";
      const bool last_sequence = seq == sequences - 1;
      // Per (layer, chunk): what forward leaves for backward.
      struct Saved {
        sim::TaskId kv_hbm = -1, kv_host = -1, kv_d2h = -1;  // K/V in HBM, or in host DRAM and its copy
        sim::TaskId work = -1, host = -1, host_d2h = -1;      // kept activations in HBM, or their host copy
        sim::TaskId out = -1;                                 // the visit's last task
      };
      std::vector<std::vector<Saved>> saved(static_cast<std::size_t>(L + 1), std::vector<Saved>(static_cast<std::size_t>(C)));
      // What a task is in the model's terms (sim::Op, for the executor); tasks are tagged with g.set_op as they are added.
      auto at = [&](sim::OpCode code, int l, int k, int first = -1, int last = -1) {
        return sim::Op{code, static_cast<std::int32_t>(r * sequences + seq), l, k, first, last};  // the step's sequence number
      };

      // Weights streamed for a visit: a buffer per visit in flight, copied in on the H2D engine.
      auto weights_in = [&](int gpu, const std::string& name) -> std::pair<sim::TaskId, sim::TaskId> {
        if (!stream_weights) return {-1, -1};
        const sim::TaskId buf = states(g.alloc(name + " weights buffer", gpu, sim::Pool::hbm, bytes(pol.weight_bytes * layer_params),
                                        "streamed layer weights", ids({visit_end_back(gpu, 2)})));
        return {buf, states(g.copy(name + " H2D weights", gpu, {sim::Copy::Direction::h2d, bytes(pol.weight_bytes * layer_params), true}, ids({buf})))};
      };
      // A visit's output on its way to the next stage's GPU (nothing to send when that is the same GPU).
      auto arrive = [&](sim::TaskId produced, int from_gpu, int to_gpu, const std::string& name, sim::Op what) -> sim::TaskId {
        if (produced < 0 || from_gpu == to_gpu) return produced;
        return g.set_op(g.send(name, from_gpu, to_gpu, bytes(hidden_chunk), ids({produced}), kSendStream), what);
      };

      // ---- forward -------------------------------------------------------------------------------------------
      for (const Visit& v : forward_order) {
        const int l = v.stage, k = v.chunk;
        const int gpu = gpu_of(l);
        const sim::DeviceId host = host_of(gpu);
        const std::string name = "F" + seq_tag + " L" + std::to_string(l) + " C" + std::to_string(k);
        Saved& sv = saved[static_cast<std::size_t>(l)][static_cast<std::size_t>(k)];
        sim::TaskId input;
        if (l == 0) {
          input = emit_embedding(g, gpu, "F" + seq_tag + " C" + std::to_string(k) + " embedding", c, h, false,
                                 gpu_last[static_cast<std::size_t>(gpu)], at(sim::OpCode::embed, 0, k));
          gpu_last[static_cast<std::size_t>(gpu)] = input;
        } else {
          input = saved[static_cast<std::size_t>(l - 1)][static_cast<std::size_t>(k)].out;
        }
        const auto [wbuf, wcopy] = weights_in(gpu, name);
        const sim::TaskId prev = gpu_last[static_cast<std::size_t>(gpu)];
        sv.kv_hbm = g.set_op(g.alloc(name + " kv", gpu, sim::Pool::hbm, bytes(kv_chunk), "K/V of a chunk", ids({prev})), at(sim::OpCode::kv, l, k, k, k));
        sv.work = g.set_op(g.alloc(name + " activations", gpu, sim::Pool::hbm, bytes(kept), "activations of a chunk", ids({prev})),
                       at(sim::OpCode::acts, l, k));

        std::vector<sim::TaskId> stream_buffers;
        LayerEmitter emitter(g, model, chunk_split, {gpu});
        emitter.set_coordinates(static_cast<int>(r * sequences + seq), l, k);
        emitter.set_attention_hook([&](const std::string& an, bool, std::vector<sim::TaskId>& last, bool rec) {
          if (kv_dram) {
            sv.kv_host = g.set_op(g.alloc(an + " host kv", host, sim::Pool::dram, bytes(kv_chunk), "K/V in host DRAM", ids({last[0]})),
                              at(sim::OpCode::kv, l, k, k, k));
            sv.kv_d2h = g.set_op(g.copy(an + " D2H kv", gpu, {sim::Copy::Direction::d2h, bytes(kv_chunk), true}, ids({sv.kv_host, last[0]})),
                             at(sim::OpCode::kv, l, k, k, k));
          }
          const auto heads = static_cast<std::int32_t>(model.heads), kv_heads = static_cast<std::int32_t>(model.kv_heads);
          const auto hd = static_cast<std::int32_t>(model.head_dim);
          last[0] = g.add({an + " C" + std::to_string(k) + " x C" + std::to_string(k), gpu, {sim::StreamKind::compute, 0}, rec,
                           sim::Attention{c, c, heads, kv_heads, hd, true, false}, at(sim::OpCode::attn, l, k, k, k)},
                          ids({last[0]}));
          if (k == 0) return;
          if (!kv_dram) {  // every earlier chunk's K/V is in HBM: one call
            last[0] = g.add({an + " C" + std::to_string(k) + " x C0..C" + std::to_string(k - 1), gpu, {sim::StreamKind::compute, 0}, rec,
                             sim::Attention{c, c * k, heads, kv_heads, hd, false, false}, at(sim::OpCode::attn, l, k, 0, k - 1)},
                            ids({last[0]}));
          } else {
            std::vector<sim::TaskId> blocks;
            for (int d = 0; d < std::min(p.prefetch, (k + span - 1) / span); ++d) {
              stream_buffers.push_back(g.set_op(g.alloc(an + " kv buffer " + std::to_string(d), gpu, sim::Pool::hbm, bytes(kv_chunk * span),
                                                    "K/V stream buffers", ids({prev})),
                                            at(sim::OpCode::kv, l, k, 0, k - 1)));
            }
            for (int j0 = 0, b = 0; j0 < k; j0 += span, ++b) {
              const int j1 = std::min(k, j0 + span);
              std::vector<sim::TaskId> deps{stream_buffers[static_cast<std::size_t>(b % p.prefetch)]};
              for (int j = j0; j < j1; ++j) deps.push_back(saved[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)].kv_d2h);
              if (b >= p.prefetch) deps.push_back(blocks[static_cast<std::size_t>(b - p.prefetch)]);  // its buffer is free again
              const std::string range = "C" + std::to_string(j0) + (j1 - j0 > 1 ? "..C" + std::to_string(j1 - 1) : "");
              const sim::TaskId in_copy = g.set_op(g.copy(an + " H2D kv " + range, gpu,
                                                      {sim::Copy::Direction::h2d, bytes(kv_chunk * (j1 - j0)), true}, deps),
                                               at(sim::OpCode::kv, l, k, j0, j1 - 1));
              last[0] = g.add({an + " C" + std::to_string(k) + " x " + range, gpu, {sim::StreamKind::compute, 0}, rec,
                               sim::Attention{c, c * (j1 - j0), heads, kv_heads, hd, false, false}, at(sim::OpCode::attn, l, k, j0, j1 - 1)},
                              ids({last[0], in_copy}));
              blocks.push_back(last[0]);
            }
          }
          // Merge the partial outputs by their log-sum-exp.
          last[0] = g.elementwise(an + " merge", gpu, {bytes(2 * kBf16 * static_cast<double>(c * model.q_dim())),
                                                      bytes(kBf16 * static_cast<double>(c * model.q_dim()))},
                                  ids({last[0]}), 0);
          g.set_op(last[0], at(sim::OpCode::attn_merge, l, k));
        });
        std::vector<sim::TaskId> chain{prev};
        const auto begin = static_cast<sim::TaskId>(g.size());
        emitter.forward(name, chain);
        // The visit's first op needs its input, its buffers and (streamed) its weights.
        for (sim::TaskId dep : ids({input, sv.kv_hbm, sv.work, wcopy})) g.add_dependency(dep, begin);
        const sim::TaskId out = chain[0];
        // The output leaves for the next stage at once (sends are in order on the comm stream, so they are issued
        // in the order the outputs are produced, not the order their consumers are emitted).
        sv.out = l + 1 < L ? arrive(out, gpu, gpu_of(l + 1), "F" + seq_tag + " L" + std::to_string(l + 1) + " C" + std::to_string(k) + " recv input",
                                    at(sim::OpCode::input, l + 1, k))
                           : out;
        gpu_last[static_cast<std::size_t>(gpu)] = out;
        visit_ends[static_cast<std::size_t>(gpu)].push_back(out);
        for (auto buf : stream_buffers) g.free(name + " free kv buffer", buf, ids({out}));
        if (wbuf >= 0) g.free(name + " free weights buffer", wbuf, ids({out}));
        if (kv_dram) {
          g.free(name + " free kv", sv.kv_hbm, ids({out, sv.kv_d2h}));
          sv.kv_hbm = -1;
        }
        if (!acts_hbm) {  // to host DRAM: everything kept, or only what recompute needs
          const double out_bytes = recompute ? checkpoint : kept;
          const sim::Op kept_op = at(recompute ? sim::OpCode::checkpoint : sim::OpCode::acts, l, k);
          sv.host = g.set_op(g.alloc(name + " host activations", host, sim::Pool::dram, bytes(out_bytes),
                                 recompute ? "checkpoints in host DRAM" : "activations in host DRAM", ids({out})),
                         kept_op);
          const sim::TaskId d2h =
              g.set_op(g.copy(name + " D2H activations", gpu, {sim::Copy::Direction::d2h, bytes(out_bytes), true}, ids({sv.host})), kept_op);
          sv.host_d2h = d2h;
          g.free(name + " free activations", sv.work, ids({d2h}));
          sv.work = -1;
        }
        if (l == L - 1) {  // the LM head's stop keeps the final hidden state of the chunk until its backward
          const int head_gpu = gpu_of(L);
          Saved& hs = saved[static_cast<std::size_t>(L)][static_cast<std::size_t>(k)];
          const std::string hname = "F" + seq_tag + " head C" + std::to_string(k);
          const sim::Op hidden = at(sim::OpCode::input, L, k);
          hs.out = arrive(out, gpu, head_gpu, hname + " recv hidden", hidden);
          if (acts_hbm) {
            hs.work = g.set_op(g.alloc(hname + " hidden", head_gpu, sim::Pool::hbm, bytes(hidden_chunk), "final hidden states", ids({hs.out})), hidden);
          } else {
            hs.host = g.set_op(g.alloc(hname + " host hidden", host_of(head_gpu), sim::Pool::dram, bytes(hidden_chunk), "final hidden states in host DRAM",
                                ids({hs.out})),
                           hidden);
            hs.out = g.set_op(g.copy(hname + " D2H hidden", head_gpu, {sim::Copy::Direction::d2h, bytes(hidden_chunk), true}, ids({hs.host})), hidden);
          }
        }
      }

      // ---- backward ------------------------------------------------------------------------------------------
      std::vector<sim::TaskId> accumulators(static_cast<std::size_t>(L), -1);  // per layer: dK/dV of earlier chunks
      std::vector<std::vector<sim::TaskId>> acc_written(static_cast<std::size_t>(L));  // per layer, per block: last D2H
      std::vector<std::vector<sim::TaskId>> grad_out(static_cast<std::size_t>(L + 1), std::vector<sim::TaskId>(static_cast<std::size_t>(C), -1));
      for (const Visit& v : backward_order) {
        const int l = v.stage, k = v.chunk;
        const int gpu = gpu_of(l);
        const sim::DeviceId host = host_of(gpu);
        Saved& sv = saved[static_cast<std::size_t>(l)][static_cast<std::size_t>(k)];
        const sim::TaskId prev = gpu_last[static_cast<std::size_t>(gpu)];
        const sim::TaskId reuse = visit_end_back(gpu, 2);  // reloads may start once the visit before last is done
        if (l == L) {  // LM head and loss of chunk k, fused forward and backward
          const std::string name = "B" + seq_tag + " head C" + std::to_string(k);
          sim::TaskId ready = sv.out;
          sim::TaskId buf = sv.work;
          if (!acts_hbm) {
            buf = g.set_op(g.alloc(name + " hidden", gpu, sim::Pool::hbm, bytes(hidden_chunk), "final hidden states", ids({reuse})),
                       at(sim::OpCode::input, L, k));
            ready = g.set_op(g.copy(name + " H2D hidden", gpu, {sim::Copy::Direction::h2d, bytes(hidden_chunk), true}, ids({buf, sv.out})),
                         at(sim::OpCode::input, L, k));
          }
          const sim::TaskId begin_id = static_cast<sim::TaskId>(g.size());
          const sim::TaskId done = emit_loss(g, gpu, "C" + std::to_string(k) + seq_tag, c, h, model.vocab, prev, at(sim::OpCode::none, L, k));
          g.add_dependency(ready, begin_id);
          g.free(name + " free hidden", buf, ids({done}));
          if (sv.host >= 0) g.free(name + " free host hidden", sv.host, ids({ready}));
          grad_out[static_cast<std::size_t>(L)][static_cast<std::size_t>(k)] =
              arrive(done, gpu, gpu_of(L - 1), "B" + seq_tag + " L" + std::to_string(L - 1) + " C" + std::to_string(k) + " recv grad",
                     at(sim::OpCode::input_grad, L, k));
          gpu_last[static_cast<std::size_t>(gpu)] = done;
          visit_ends[static_cast<std::size_t>(gpu)].push_back(done);
          if (k == 0 && last_sequence) layer_done[static_cast<std::size_t>(gpu)][static_cast<std::size_t>(L)] = done;
          continue;
        }
        const std::string name = "B" + seq_tag + " L" + std::to_string(l) + " C" + std::to_string(k);
        const sim::TaskId input = grad_out[static_cast<std::size_t>(l + 1)][static_cast<std::size_t>(k)];
        const auto [wbuf, wcopy] = weights_in(gpu, name);
        std::vector<sim::TaskId> ready = ids({input, wcopy});
        // What forward kept: the activations (reloaded from DRAM, or the checkpoint to recompute from) and K/V.
        if (!acts_hbm) {
          sv.work = g.set_op(g.alloc(name + " activations", gpu, sim::Pool::hbm, bytes(kept), "activations of a chunk", ids({reuse})),
                         at(sim::OpCode::acts, l, k));
          const double in_bytes = recompute ? checkpoint : kept;
          ready.push_back(g.set_op(g.copy(name + " H2D activations", gpu, {sim::Copy::Direction::h2d, bytes(in_bytes), true}, ids({sv.work, sv.host_d2h})),
                               at(recompute ? sim::OpCode::checkpoint : sim::OpCode::acts, l, k)));
        }
        if (kv_dram) {
          sv.kv_hbm = g.set_op(g.alloc(name + " kv", gpu, sim::Pool::hbm, bytes(kv_chunk), "K/V of a chunk", ids({reuse})), at(sim::OpCode::kv, l, k, k, k));
          if (!recompute) {  // recompute produces this chunk's K/V again
            ready.push_back(g.set_op(g.copy(name + " H2D kv", gpu, {sim::Copy::Direction::h2d, bytes(kv_chunk), true}, ids({sv.kv_hbm, sv.kv_d2h})),
                                 at(sim::OpCode::kv, l, k, k, k)));
          }
        }
        if (k == C - 1 && C > 1) {  // dK/dV of every earlier chunk accumulate over this layer's backward
          accumulators[static_cast<std::size_t>(l)] =
              g.set_op(g.alloc(name + " dkv accumulators", kv_dram ? host : gpu, kv_dram ? sim::Pool::dram : sim::Pool::hbm,
                           bytes(acc_chunk * (C - 1)), "fp32 dK/dV accumulators", ids({prev})),
                   at(sim::OpCode::dkv, l, k, 0, C - 2));
        }
        std::vector<sim::TaskId> stream_buffers;
        // The chunk's own fp32 dK/dV (finished in this visit) and, with K/V in DRAM, the stream buffers.
        const sim::TaskId own_acc = g.set_op(g.alloc(name + " dkv", gpu, sim::Pool::hbm, bytes(acc_chunk), "fp32 dK/dV of a chunk", ids({prev})),
                                         at(sim::OpCode::dkv, l, k, k, k));
        auto& written = acc_written[static_cast<std::size_t>(l)];
        LayerEmitter emitter(g, model, chunk_split, {gpu});
        emitter.set_coordinates(static_cast<int>(r * sequences + seq), l, k);
        emitter.set_attention_hook([&](const std::string& an, bool backward, std::vector<sim::TaskId>& last, bool rec) {
          if (!backward) return;  // recompute keeps the attention output and lse: attention is not run again
          const auto heads = static_cast<std::int32_t>(model.heads), kv_heads = static_cast<std::int32_t>(model.kv_heads);
          const auto hd = static_cast<std::int32_t>(model.head_dim);
          // The diagonal block; with K/V in DRAM this chunk's accumulated dK/dV come in first (nothing to read for
          // the last chunk).
          sim::TaskId acc_in = -1;
          if (kv_dram && k < C - 1) {
            acc_in = g.set_op(g.copy(an + " H2D dkv C" + std::to_string(k), gpu, {sim::Copy::Direction::h2d, bytes(acc_chunk), true},
                                 ids({own_acc, written.empty() ? -1 : written[static_cast<std::size_t>(k / span)]})),
                          at(sim::OpCode::dkv, l, k, k, k));
          }
          last[0] = g.add({an + " C" + std::to_string(k) + " x C" + std::to_string(k), gpu, {sim::StreamKind::compute, 0}, rec,
                           sim::Attention{c, c, heads, kv_heads, hd, true, true}, at(sim::OpCode::attn_bwd, l, k, k, k)},
                          ids({last[0], acc_in}));
          if (k == 0) return;
          if (!kv_dram) {
            last[0] = g.add({an + " C" + std::to_string(k) + " x C0..C" + std::to_string(k - 1), gpu, {sim::StreamKind::compute, 0}, rec,
                             sim::Attention{c, c * k, heads, kv_heads, hd, false, true}, at(sim::OpCode::attn_bwd, l, k, 0, k - 1)},
                            ids({last[0]}));
            return;
          }
          const int nblocks = (k + span - 1) / span;
          for (int d = 0; d < std::min(p.prefetch, nblocks); ++d) {
            stream_buffers.push_back(g.set_op(g.alloc(an + " kv dkv buffer " + std::to_string(d), gpu, sim::Pool::hbm,
                                                  bytes((kv_chunk + acc_chunk) * span), "K/V and dK/dV stream buffers", ids({prev})),
                                          at(sim::OpCode::kv_dkv, l, k, 0, k - 1)));
          }
          std::vector<sim::TaskId> blocks, now_written;
          for (int j0 = 0, b = 0; j0 < k; j0 += span, ++b) {
            const int j1 = std::min(k, j0 + span);
            const std::string range = "C" + std::to_string(j0) + (j1 - j0 > 1 ? "..C" + std::to_string(j1 - 1) : "");
            std::vector<sim::TaskId> deps{stream_buffers[static_cast<std::size_t>(b % p.prefetch)]};
            if (b >= p.prefetch) {  // the buffer is free again once its last block is computed and its dK/dV copied out
              deps.push_back(blocks[static_cast<std::size_t>(b - p.prefetch)]);
              deps.push_back(now_written[static_cast<std::size_t>(b - p.prefetch)]);
            }
            for (int j = j0; j < j1; ++j) deps.push_back(saved[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)].kv_d2h);  // forward wrote them
            const sim::TaskId kv_in =
                g.set_op(g.copy(an + " H2D kv " + range, gpu, {sim::Copy::Direction::h2d, bytes(kv_chunk * (j1 - j0)), true}, deps),
                     at(sim::OpCode::kv, l, k, j0, j1 - 1));
            std::vector<sim::TaskId> block_deps{last[0], kv_in};
            if (k < C - 1) {  // read-modify-write of the accumulators (the last chunk writes them first)
              if (static_cast<std::size_t>(b) < written.size()) deps.push_back(written[static_cast<std::size_t>(b)]);
              block_deps.push_back(
                  g.set_op(g.copy(an + " H2D dkv " + range, gpu, {sim::Copy::Direction::h2d, bytes(acc_chunk * (j1 - j0)), true}, deps),
                       at(sim::OpCode::dkv, l, k, j0, j1 - 1)));
            }
            last[0] = g.add({an + " C" + std::to_string(k) + " x " + range, gpu, {sim::StreamKind::compute, 0}, rec,
                             sim::Attention{c, c * (j1 - j0), heads, kv_heads, hd, false, true}, at(sim::OpCode::attn_bwd, l, k, j0, j1 - 1)},
                            block_deps);
            blocks.push_back(last[0]);
            now_written.push_back(g.set_op(g.copy(an + " D2H dkv " + range, gpu, {sim::Copy::Direction::d2h, bytes(acc_chunk * (j1 - j0)), true},
                                              ids({last[0]})),
                                       at(sim::OpCode::dkv, l, k, j0, j1 - 1)));
          }
          written = now_written;
        });
        std::vector<sim::TaskId> chain{prev};
        const auto begin = static_cast<sim::TaskId>(g.size());
        if (recompute) emitter.forward("R" + seq_tag + " L" + std::to_string(l) + " C" + std::to_string(k), chain, true);
        emitter.backward(name, chain);
        for (sim::TaskId dep : ready) g.add_dependency(dep, begin);
        const sim::TaskId out = chain[0];
        grad_out[static_cast<std::size_t>(l)][static_cast<std::size_t>(k)] =
            l > 0 ? arrive(out, gpu, gpu_of(l - 1), "B" + seq_tag + " L" + std::to_string(l - 1) + " C" + std::to_string(k) + " recv grad",
                           at(sim::OpCode::input_grad, l, k))
                  : out;
        gpu_last[static_cast<std::size_t>(gpu)] = out;
        visit_ends[static_cast<std::size_t>(gpu)].push_back(out);
        if (!stream_buffers.empty()) {  // the buffers are read until the last dK/dV block is back in host DRAM
          std::vector<sim::TaskId> deps{out};
          deps.insert(deps.end(), written.begin(), written.end());
          for (auto buf : stream_buffers) g.free(name + " free buffer", buf, deps);
        }
        g.free(name + " free dkv", own_acc, ids({out}));
        if (wbuf >= 0) g.free(name + " free weights buffer", wbuf, ids({out}));
        if (sv.work >= 0) g.free(name + " free activations", sv.work, ids({out}));
        if (sv.kv_hbm >= 0) g.free(name + " free kv", sv.kv_hbm, ids({out}));
        if (sv.kv_host >= 0) g.free(name + " free host kv", sv.kv_host, ids({out}));
        if (sv.host >= 0) g.free(name + " free host activations", sv.host, ids({out}));
        if (stream_weights) {  // this visit's weight gradients go to the host and are added there
          const double grad_bytes = pol.grad_bytes * layer_params;
          const sim::TaskId d2h = states(g.copy(name + " D2H weight grads", gpu, {sim::Copy::Direction::d2h, bytes(grad_bytes), true}, ids({out})));
          grads_ready[static_cast<std::size_t>(gpu)].push_back(g.add({name + " host accumulate grads", host, {sim::StreamKind::host, 0}, false,
                                            sim::OptimizerStep{bytes(grad_bytes + 2 * pol.grad_bytes * layer_params)}, {sim::OpCode::states}},
                                           ids({d2h})));
        }
        if (l == 0) {
          gpu_last[static_cast<std::size_t>(gpu)] =
              emit_embedding(g, gpu, "B" + seq_tag + " C" + std::to_string(k) + " embedding", c, h, true, out, at(sim::OpCode::embed_bwd, 0, k));
          if (k == 0 && last_sequence) layer_done[static_cast<std::size_t>(gpu)][static_cast<std::size_t>(L + 1)] = gpu_last[static_cast<std::size_t>(gpu)];
        }
        if (k == 0) {  // layer l's backward is complete for this sequence
          if (accumulators[static_cast<std::size_t>(l)] >= 0) {
            std::vector<sim::TaskId> deps{out};
            for (auto id : written) deps.push_back(id);
            g.free(name + " free dkv accumulators", accumulators[static_cast<std::size_t>(l)], deps);
          }
          if (last_sequence) layer_done[static_cast<std::size_t>(gpu)][static_cast<std::size_t>(l)] = out;
        }
      }
    }
  }

  // Per ring position: all-reduce each layer's gradients (then the LM head's and the embedding's) across the
  // replicas as soon as that part's backward is complete everywhere (overlapped with the rest of backward), then
  // the optimizer step where the states live.
  if (replicas > 1) {
    for (int pos = 0; pos < P; ++pos) {
      std::vector<sim::DeviceId> members;
      for (int r = 0; r < replicas; ++r) members.push_back(plan.rings[static_cast<std::size_t>(r)][static_cast<std::size_t>(pos)]);
      const std::int32_t group = g.add_group(members);
      for (int l = 0; l < L + 2; ++l) {
        const bool head = l == L, embedding = l == L + 1;
        if (stage_position[static_cast<std::size_t>(embedding ? 0 : l)] != pos) continue;
        std::vector<sim::TaskId> deps;
        for (auto m : members) {
          deps.push_back(layer_done[static_cast<std::size_t>(m)][static_cast<std::size_t>(l)]);
          for (auto id : grads_ready[static_cast<std::size_t>(m)]) deps.push_back(id);  // streamed: the host's sums
        }
        const double grad_bytes = pol.grad_bytes * (head ? head_params : embedding ? embedding_params : layer_params);
        const std::string part = head ? "head" : embedding ? "embedding" : "L" + std::to_string(l);
        const sim::TaskId ar = states(g.collective("all-reduce grads " + part,
                                            {sim::CollectiveOp::all_reduce, sim::Algorithm::ring, group,
                                             (bytes(grad_bytes) + replicas - 1) / replicas * replicas},
                                            deps, kReduceStream));
        for (auto m : members) reduced[static_cast<std::size_t>(m)].push_back(ar);
      }
    }
  }
  for (int gpu = 0; gpu < gpus; ++gpu) {
    const int r = gpu / P;
    const auto& ring = plan.rings[static_cast<std::size_t>(r)];
    const int pos = static_cast<int>(std::find(ring.begin(), ring.end(), gpu) - ring.begin());
    const double owned = owned_params[static_cast<std::size_t>(pos)];
    // The optimizer waits for everything on this GPU (its compute stream is in order) and its reductions.
    std::vector<sim::TaskId> deps = reduced[static_cast<std::size_t>(gpu)];
    for (sim::TaskId id = static_cast<sim::TaskId>(g.size()) - 1; id >= 0; --id) {
      const auto& t = g.task(id);
      if (t.device == gpu && t.stream.kind == sim::StreamKind::compute) {
        deps.push_back(id);
        break;
      }
    }
    const auto opt_bytes = bytes(owned * kAdamBytesPerParam);
    if (states_dram) {
      const sim::DeviceId host = sim::host_device(in.cluster.node_of(gpu));
      std::vector<sim::TaskId> host_deps = deps;
      if (!stream_weights) {
        host_deps = {states(g.copy("D2H grads gpu" + std::to_string(gpu), gpu, {sim::Copy::Direction::d2h, bytes(pol.grad_bytes * owned), true}, deps))};
      } else {  // the host's sums of this GPU's per-visit gradients
        for (auto id : grads_ready[static_cast<std::size_t>(gpu)]) host_deps.push_back(id);
      }
      const sim::TaskId step = g.add({"optimizer step host for gpu" + std::to_string(gpu), host, {sim::StreamKind::host, 0}, false,
                                      sim::OptimizerStep{opt_bytes}, {sim::OpCode::optimizer, 0, -1, -1, gpu, gpu}},
                                     host_deps);
      if (!stream_weights) {
        states(g.copy("H2D updated weights gpu" + std::to_string(gpu), gpu, {sim::Copy::Direction::h2d, bytes(pol.weight_bytes * owned), true},
                      ids({step})));
      }
    } else {
      g.add({"optimizer step gpu" + std::to_string(gpu), gpu, {sim::StreamKind::compute, 0}, false, sim::OptimizerStep{opt_bytes},
             {sim::OpCode::optimizer, 0, -1, -1, gpu, gpu}},
            deps);
    }
  }
  return plan;
}

}  // namespace trainyard::planner
