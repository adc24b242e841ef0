#include "planner/schemes/ringtrack/ringtrack.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <tuple>

#include "common/error.hpp"
#include "common/units.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/ringtrack/closed_form.hpp"
#include "planner/transformer.hpp"

namespace trainyard::planner {

namespace {

constexpr double kBf16 = 2, kFp32 = 4;
constexpr int kSendStream = 0, kReduceStream = 2;

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
  std::vector<double> stage_free(static_cast<std::size_t>(stages), 0);                 // when its previous chunk ended
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
      const int k = next[s];
      if (k < 0 || k >= chunks) continue;
      double ready = stage_free[s];
      const int upstream = backward ? s + 1 : s - 1;
      if (upstream >= 0 && upstream < stages) {
        const double at = finish[upstream][k];
        if (at < 0) continue;
        ready = std::max(ready, at);
      }
      const auto pos = static_cast<std::size_t>(stage_position[s]);
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
      if (pick[pos] >= 0 && (best < 0 || pick_start[pos] < best_start)) {
        best = pick[pos];
        best_start = pick_start[pos];
      }
    }
    TRAINYARD_CHECK(best >= 0, "the train always has a visit that can run");
    const int k = next[best];
    const double end = best_start + cost(best, k);
    finish[best][k] = end;
    stage_free[best] = end;
    gpu_free[stage_position[best]] = end;
    next[best] += backward ? -1 : 1;
    order.push_back({best, k});
  }
  return order;
}

}  // namespace

std::string RingTrackPlan::describe() const {
  std::ostringstream out;
  if (rings.empty()) return "";
  const auto& ring = rings.front();
  for (std::size_t i = 0; i < ring.size(); ++i) out << (i ? " -> " : "") << "gpu" << ring[i];
  if (ring.size() > 1) {
    double slowest = hops.front().GBps;
    for (const auto& h : hops) slowest = std::min(slowest, h.GBps);
    out << " -> gpu" << ring.front() << " (slowest hop " << format_fixed(slowest, 1) << " GB/s)";
  }
  if (rings.size() > 1) out << "; " << rings.size() << " data-parallel replicas of this ring";
  return out.str();
}

// --- the order of the train -------------------------------------------------------------------------------------

std::vector<int> stage_positions(std::int64_t layers, const RingTrackParams& p) {
  const int L = static_cast<int>(layers);
  std::vector<int> out(static_cast<std::size_t>(L + 1));
  for (int l = 0; l < L; ++l) out[l] = (l / p.block) % p.ring;
  out[L] = ((L - 1) / p.block + 1) % p.ring;
  return out;
}

std::vector<int> layers_per_position(const std::vector<int>& stage_positions, int ring) {
  std::vector<int> out(static_cast<std::size_t>(ring), 0);
  for (std::size_t l = 0; l + 1 < stage_positions.size(); ++l) ++out[stage_positions[l]];
  return out;
}

namespace {

TrainSchedule make_train_schedule(const model::ModelConfig& model, const RingTrackParams& p, std::int64_t seq_len) {
  const int L = static_cast<int>(model.layers);
  const int chunk_count = static_cast<int>(seq_len / p.chunk);
  const double c = static_cast<double>(p.chunk);  // the chunk's tokens
  TrainSchedule t;
  t.stage_position = stage_positions(model.layers, p);
  // Visit costs for ordering the train, in FLOPs: the dense ops of a chunk, its attention against itself and the
  // earlier chunks (growing with k), backward twice forward plus what recompute runs again; the head stage is the
  // LM head and loss (forward, input gradient and weight gradient GEMMs).
  const double dense_flops = 2 * model.param_counts().per_layer() * c;
  auto attention_flops = [&](int k) { return 4.0 * c * c * (k + 0.5) * static_cast<double>(model.q_dim()); };
  const bool recompute = p.acts == ActivationPolicy::recompute;
  t.forward = train_order(L, chunk_count, t.stage_position, p.ring, false, [&](int, int k) { return dense_flops + attention_flops(k); });
  t.backward = train_order(L + 1, chunk_count, t.stage_position, p.ring, true, [&](int s, int k) {
    if (s == L) return 6 * c * static_cast<double>(model.vocab * model.hidden);
    return 2 * (dense_flops + attention_flops(k)) + (recompute ? dense_flops : 0);
  });
  return t;
}

}  // namespace

// The search asks for the same schedule once per candidate that differs only in placements and prefetch (its bounds,
// its estimate, its builder): the schedules made are kept, keyed by everything make_train_schedule reads, a few
// hundred at most (a search's lengths and chunkings), under a lock since the bounds phase runs on many threads.
TrainSchedule train_schedule(const model::ModelConfig& model, const RingTrackParams& p, std::int64_t seq_len) {
  using Key = std::tuple<std::int64_t, double, std::int64_t, std::int64_t, std::int64_t, int, int, std::int64_t, bool, std::int64_t>;
  const Key key{model.layers, model.param_counts().per_layer(),      model.q_dim(), model.vocab, model.hidden, p.ring, p.block,
                p.chunk,      p.acts == ActivationPolicy::recompute, seq_len};
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const TrainSchedule>> made;
  constexpr std::size_t kMostKept = 512;
  {
    const std::lock_guard lock(mutex);
    if (const auto it = made.find(key); it != made.end()) return *it->second;
  }
  auto schedule = std::make_shared<const TrainSchedule>(make_train_schedule(model, p, seq_len));
  const std::lock_guard lock(mutex);
  if (made.size() >= kMostKept) made.clear();
  made.emplace(key, schedule);
  return *schedule;
}

// --- checks ----------------------------------------------------------------------------------------------------

void check_ringtrack(const StepInputs& in, const RingTrackParams& p) {
  const auto& m = in.model;
  const int gpus = in.cluster.gpus();
  auto fail = [](const std::string& flag, const std::string& expected, const std::string& got) { throw InputError(flag, "value", expected, got); };
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

namespace {

// Builds one ring-track step. Its state is the members; its phases the methods build() calls in order: the rings,
// then per replica its model states and, per sequence, the train's forward visits and backward visits (each a
// layer on one chunk, with its buffers, K/V streaming and the sends to the next stage), then the gradients'
// all-reduce across replicas and the optimizer steps.
class RingTrackBuilder {
 public:
  RingTrackBuilder(const StepInputs& in, const RingTrackParams& p);
  RingTrackPlan build();

 private:
  // Per (layer, chunk): what forward leaves for backward.
  struct Saved {
    sim::TaskId kv_hbm = -1, kv_host = -1, kv_d2h = -1;  // K/V in HBM, or in host DRAM and its copy
    sim::TaskId work = -1, host = -1, host_d2h = -1;     // kept activations in HBM, or their host copy
    sim::TaskId out = -1;                                // the visit's last task
  };
  // One sequence of one replica going through the ring.
  struct Train {
    int r;
    std::int32_t seq_number;  // the step's sequence number
    std::string seq_tag;      // " s3" when there are several sequences
    bool last_sequence;
    std::vector<std::vector<Saved>> saved;              // [layer (L: the head)][chunk]
    std::vector<sim::TaskId> accumulators;              // per layer: dK/dV of earlier chunks
    std::vector<std::vector<sim::TaskId>> acc_written;  // per layer, per block: last D2H
    std::vector<std::vector<sim::TaskId>> grad_out;     // [layer][chunk]: the gradient arriving at layer - 1
    // What a task is in the model's terms (sim::Op, for the executor).
    sim::Op at(sim::OpCode code, int l, int k) const { return sim::Op{code, seq_number, l, k}; }
    sim::Op kv(sim::OpCode code, int l, int k, int kv_first, int kv_last) const {
      return sim::Op::kv_range(code, seq_number, l, k, kv_first, kv_last);
    }
  };
  // A visit's identity while its tasks are emitted.
  struct VisitAt {
    int l, k, gpu;
    sim::DeviceId host;
    std::string name;
    sim::TaskId prev;  // the GPU's latest compute task before the visit
  };

  int gpu_of(int r, int stage) const { return plan_.rings[r][schedule_.stage_position[stage]]; }
  sim::DeviceId host_of(int gpu) const { return sim::host_device(in_.cluster.node_of(gpu)); }
  // The end of the visit `depth` back on this GPU, so that buffers of visit i wait for visit i - depth to finish.
  sim::TaskId visit_end_back(int gpu, std::size_t depth) const {
    const auto& ends = visit_ends_[gpu];
    return ends.size() >= depth ? ends[ends.size() - depth] : -1;
  }
  // Model states are moved and updated whole; the executor tracks them per process (sim::OpCode::states).
  sim::TaskId states(sim::TaskId id) { return g_.set_op(id, {sim::OpCode::states}); }
  std::pair<sim::TaskId, sim::TaskId> weights_in(int gpu, int layer, const std::string& name);
  sim::TaskId arrive(sim::TaskId produced, int from_gpu, int to_gpu, const std::string& name, sim::Op what);
  sim::TaskId attend(const VisitAt& v, const std::string& name, const Train& t, std::int64_t kv_len, bool causal, bool backward, bool rec, int first,
                     int last, std::vector<sim::TaskId> deps);

  void choose_rings();
  void model_states(int r);
  void forward_visit(Train& t, const Visit& visit);
  void forward_attention(Train& t, const VisitAt& v, Saved& sv, std::vector<sim::TaskId>& stream_buffers, const std::string& an,
                         std::vector<sim::TaskId>& last, bool rec);
  void keep_activations(Train& t, const VisitAt& v, Saved& sv, sim::TaskId out);
  void keep_head_hidden(Train& t, const VisitAt& v, sim::TaskId out);
  void backward_head(Train& t, const VisitAt& v);
  void backward_visit(Train& t, const Visit& visit);
  std::vector<sim::TaskId> reload(Train& t, const VisitAt& v, Saved& sv, sim::TaskId reuse);
  void backward_attention(Train& t, const VisitAt& v, sim::TaskId own_acc, std::vector<sim::TaskId>& stream_buffers, const std::string& an,
                          std::vector<sim::TaskId>& last, bool rec);
  void release_after_backward(Train& t, const VisitAt& v, Saved& sv, sim::TaskId out, sim::TaskId own_acc, sim::TaskId wbuf,
                              const std::vector<sim::TaskId>& stream_buffers);
  void reduce_gradients();
  void optimizer_steps();

  const StepInputs& in_;
  const RingTrackParams& p_;
  const model::ModelConfig& model_;
  const model::PrecisionPolicy& pol_;
  const int gpus_, P_, replicas_, L_, chunk_count_;
  const std::int64_t c_, h_, sequences_;
  LayerSplit chunk_split_;
  double kv_chunk_ = 0;    // K and V of one chunk
  double acc_chunk_ = 0;   // fp32 dK and dV
  double kept_ = 0;        // everything but K and V
  double checkpoint_ = 0;  // layer input, attention output, lse
  double hidden_chunk_ = 0;
  double layer_params_ = 0, embedding_params_ = 0, head_params_ = 0;
  int span_ = 1;  // chunks per K/V block
  bool kv_dram_, acts_hbm_, recompute_, stream_weights_, states_dram_;
  std::vector<double> resident_params_, owned_params_;  // per ring position
  TrainSchedule schedule_;

  RingTrackPlan plan_;
  sim::TaskGraph& g_ = plan_.graph;
  // Per GPU: the last backward task of each layer of the last sequence (then the head's and the embedding's: L + 2
  // entries), and (streamed weights) the host's sums of each visit's weight gradients; the reductions.
  std::vector<std::vector<sim::TaskId>> layer_done_, grads_ready_, reduced_;
  // Per replica, per GPU: the latest compute task, and the end of each visit so far.
  std::vector<sim::TaskId> gpu_last_;
  std::vector<std::vector<sim::TaskId>> visit_ends_;
};

RingTrackBuilder::RingTrackBuilder(const StepInputs& in, const RingTrackParams& p)
    : in_(in),
      p_(p),
      model_(in.model),
      pol_(in.precision),
      gpus_(in.cluster.gpus()),
      P_(p.ring),
      replicas_(in.cluster.gpus() / p.ring),
      L_(static_cast<int>(in.model.layers)),
      chunk_count_(static_cast<int>(in.workload.seq_len / p.chunk)),
      c_(p.chunk),
      h_(in.model.hidden),
      sequences_(in.workload.global_batch / (in.cluster.gpus() / p.ring)),
      kv_dram_(p.kv == Placement::dram),
      acts_hbm_(p.acts == ActivationPolicy::hbm),
      recompute_(p.acts == ActivationPolicy::recompute),
      stream_weights_(p.weights == WeightPolicy::stream),
      states_dram_(p.states == Placement::dram),
      schedule_(train_schedule(in.model, p, in.workload.seq_len)),
      layer_done_(static_cast<std::size_t>(gpus_), std::vector<sim::TaskId>(static_cast<std::size_t>(L_ + 2), -1)),
      grads_ready_(static_cast<std::size_t>(gpus_)),
      reduced_(static_cast<std::size_t>(gpus_)) {
  chunk_split_.sequence_tokens = c_;
  const ActivationBytes acts = layer_activation_bytes(model_, chunk_split_, Recompute::none);
  kv_chunk_ = kBf16 * 2 * static_cast<double>(c_ * model_.kv_dim());
  acc_chunk_ = kFp32 * 2 * static_cast<double>(c_ * model_.kv_dim());
  kept_ = acts.total() - kv_chunk_;
  checkpoint_ = kBf16 * static_cast<double>(c_ * h_) + kBf16 * static_cast<double>(c_ * model_.q_dim()) +
                kFp32 * static_cast<double>(c_ * model_.heads);
  hidden_chunk_ = kBf16 * static_cast<double>(c_ * h_);
  const auto params = model_.param_counts();
  layer_params_ = params.per_layer();
  embedding_params_ = params.embedding;
  head_params_ = static_cast<double>(model_.vocab * model_.hidden) + params.final_norm;
  span_ = static_cast<int>(std::max<std::int64_t>(1, (p.kv_block_tokens + c_ - 1) / c_));
  // Parameters each ring position holds: its layers, the embedding with layer 0, the LM head at the head's stop.
  const std::vector<int>& stage_position = schedule_.stage_position;
  const std::vector<int> owned_layers = layers_per_position(stage_position, P_);
  resident_params_.assign(static_cast<std::size_t>(P_), 0);
  owned_params_.assign(static_cast<std::size_t>(P_), 0);
  for (int pos = 0; pos < P_; ++pos) {
    const auto i = static_cast<std::size_t>(pos);
    resident_params_[i] = (pos == stage_position[0] ? embedding_params_ : 0) + (pos == stage_position[L_] ? head_params_ : 0);
    owned_params_[i] = layer_params_ * owned_layers[i] + resident_params_[i];
  }
}

RingTrackPlan RingTrackBuilder::build() {
  g_.reserve(static_cast<std::size_t>(ringtrack_tasks(in_, p_)));
  g_.set_chunk_tokens(p_.chunk);
  g_.set_sequence_tokens(in_.workload.seq_len);
  choose_rings();
  for (int r = 0; r < replicas_; ++r) {
    model_states(r);
    gpu_last_.assign(static_cast<std::size_t>(gpus_), -1);
    visit_ends_.assign(static_cast<std::size_t>(gpus_), {});
    for (std::int64_t seq = 0; seq < sequences_; ++seq) {
      Train t{r,
              static_cast<std::int32_t>(r * sequences_ + seq),
              sequences_ > 1 ? " s" + std::to_string(seq) : "",
              seq == sequences_ - 1,
              std::vector<std::vector<Saved>>(static_cast<std::size_t>(L_ + 1), std::vector<Saved>(static_cast<std::size_t>(chunk_count_))),
              std::vector<sim::TaskId>(static_cast<std::size_t>(L_), -1),
              std::vector<std::vector<sim::TaskId>>(static_cast<std::size_t>(L_)),
              std::vector<std::vector<sim::TaskId>>(static_cast<std::size_t>(L_ + 1),
                                                    std::vector<sim::TaskId>(static_cast<std::size_t>(chunk_count_), -1))};
      for (const Visit& v : schedule_.forward) forward_visit(t, v);
      for (const Visit& v : schedule_.backward) backward_visit(t, v);
    }
  }
  reduce_gradients();
  optimizer_steps();
  return std::move(plan_);
}

// Rings: replica r holds GPUs r*P .. r*P+P-1, in the chosen (or given) order.
void RingTrackBuilder::choose_rings() {
  for (int r = 0; r < replicas_; ++r) {
    std::vector<int> members(static_cast<std::size_t>(P_));
    std::iota(members.begin(), members.end(), r * P_);
    if (p_.ring_order.empty()) {
      plan_.rings.push_back(best_ring_order(in_.cluster, members));
    } else {
      std::vector<int> order;
      for (int pos : p_.ring_order) order.push_back(r * P_ + pos);
      plan_.rings.push_back(order);
    }
  }
  plan_.hops = P_ > 1 ? ring_hops(in_.cluster, plan_.rings.front()) : std::vector<RingHop>{};
}

// Model states of each ring position of replica r.
void RingTrackBuilder::model_states(int r) {
  const auto& ring = plan_.rings[r];
  for (int pos = 0; pos < P_; ++pos) {
    const int gpu = ring[pos];
    const double resident = resident_params_[pos];
    const double owned = owned_params_[pos];
    const double layers = owned - resident;
    const std::string tag = " gpu" + std::to_string(gpu);
    states(g_.alloc("weights" + tag, gpu, sim::Pool::hbm, bytes(pol_.weight_bytes * (stream_weights_ ? resident : owned)), "weights"));
    if (stream_weights_) states(g_.alloc("host weights" + tag, host_of(gpu), sim::Pool::dram, bytes(pol_.weight_bytes * layers), "streamed weights"));
    // Gradients accumulate over the chunks where the weights are (on the host when they are streamed).
    states(g_.alloc("grads" + tag, gpu, sim::Pool::hbm, bytes(pol_.grad_bytes * (stream_weights_ ? resident : owned)), "gradients"));
    if (states_dram_) states(g_.alloc("host grads" + tag, host_of(gpu), sim::Pool::dram, bytes(pol_.grad_bytes * owned), "gradients on host"));
    states(g_.alloc("optimizer" + tag, states_dram_ ? host_of(gpu) : gpu, states_dram_ ? sim::Pool::dram : sim::Pool::hbm,
                    bytes((pol_.master_bytes + pol_.optimizer_bytes) * owned), "master weights and Adam moments"));
  }
}

// Weights streamed for a visit of `layer`: a buffer per visit in flight, copied in on the H2D engine.
std::pair<sim::TaskId, sim::TaskId> RingTrackBuilder::weights_in(int gpu, int layer, const std::string& name) {
  if (!stream_weights_) return {-1, -1};
  const sim::TaskId buf = states(g_.alloc(name + " weights buffer", gpu, sim::Pool::hbm, bytes(pol_.weight_bytes * layer_params_),
                                          "streamed layer weights", ids({visit_end_back(gpu, 2)})));
  const sim::TaskId copy = g_.copy(name + " H2D weights", gpu, {sim::Copy::Direction::h2d, bytes(pol_.weight_bytes * layer_params_), true},
                                   ids({buf}));
  return {buf, g_.set_op(copy, sim::Op::layer_weights(layer))};
}

// A visit's output on its way to the next stage's GPU (nothing to send when that is the same GPU).
sim::TaskId RingTrackBuilder::arrive(sim::TaskId produced, int from_gpu, int to_gpu, const std::string& name, sim::Op what) {
  if (produced < 0 || from_gpu == to_gpu) return produced;
  return g_.set_op(g_.send(name, from_gpu, to_gpu, bytes(hidden_chunk_), ids({produced}), kSendStream), what);
}

// One attention block of chunk v.k against `kv_len` tokens of chunks first..last, on the GPU's compute stream.
sim::TaskId RingTrackBuilder::attend(const VisitAt& v, const std::string& name, const Train& t, std::int64_t kv_len, bool causal, bool backward,
                                     bool rec, int first, int last, std::vector<sim::TaskId> deps) {
  const auto heads = static_cast<std::int32_t>(model_.heads), kv_heads = static_cast<std::int32_t>(model_.kv_heads);
  const auto hd = static_cast<std::int32_t>(model_.head_dim);
  return g_.add(name,
                {v.gpu,
                 {sim::StreamKind::compute, 0},
                 rec,
                 sim::Attention{c_, kv_len, heads, kv_heads, hd, causal, backward},
                 t.kv(backward ? sim::OpCode::attn_bwd : sim::OpCode::attn, v.l, v.k, first, last)},
                deps);
}

void RingTrackBuilder::forward_visit(Train& t, const Visit& visit) {
  const int l = visit.stage, k = visit.chunk;
  const int gpu = gpu_of(t.r, l);
  const std::string name = "F" + t.seq_tag + " L" + std::to_string(l) + " C" + std::to_string(k);
  Saved& sv = t.saved[l][k];
  sim::TaskId input;
  if (l == 0) {
    input = emit_embedding(g_, gpu, "F" + t.seq_tag + " C" + std::to_string(k) + " embedding", c_, h_, false, gpu_last_[gpu],
                           t.at(sim::OpCode::embed, 0, k));
    gpu_last_[gpu] = input;
  } else {
    input = t.saved[l - 1][k].out;
  }
  const auto [wbuf, wcopy] = weights_in(gpu, l, name);
  const VisitAt v{l, k, gpu, host_of(gpu), name, gpu_last_[gpu]};
  sv.kv_hbm = g_.set_op(g_.alloc(name + " kv", gpu, sim::Pool::hbm, bytes(kv_chunk_), "K/V of a chunk", ids({v.prev})),
                        t.kv(sim::OpCode::kv, l, k, k, k));
  sv.work = g_.set_op(g_.alloc(name + " activations", gpu, sim::Pool::hbm, bytes(kept_), "activations of a chunk", ids({v.prev})),
                      t.at(sim::OpCode::acts, l, k));
  std::vector<sim::TaskId> stream_buffers;
  LayerEmitter emitter(g_, model_, chunk_split_, {gpu});
  emitter.set_coordinates(t.seq_number, l, k);
  emitter.set_attention_hook(
      [&](const std::string& an, bool, std::vector<sim::TaskId>& last, bool rec) { forward_attention(t, v, sv, stream_buffers, an, last, rec); });
  std::vector<sim::TaskId> chain{v.prev};
  const auto begin = static_cast<sim::TaskId>(g_.size());
  emitter.forward(name, chain);
  // The visit's first op needs its input, its buffers and (streamed) its weights.
  for (sim::TaskId dep : ids({input, sv.kv_hbm, sv.work, wcopy})) g_.add_dependency(dep, begin);
  const sim::TaskId out = chain[0];
  // The output leaves for the next stage at once (sends are in order on the comm stream, so they are issued in the
  // order the outputs are produced, not the order their consumers are emitted).
  sv.out = l + 1 < L_
               ? arrive(out, gpu, gpu_of(t.r, l + 1), "F" + t.seq_tag + " L" + std::to_string(l + 1) + " C" + std::to_string(k) + " recv input",
                        t.at(sim::OpCode::input, l + 1, k))
               : out;
  gpu_last_[gpu] = out;
  visit_ends_[gpu].push_back(out);
  for (auto buf : stream_buffers) g_.free(name + " free kv buffer", buf, ids({out}));
  if (wbuf >= 0) g_.free(name + " free weights buffer", wbuf, ids({out}));
  if (kv_dram_) {
    g_.free(name + " free kv", sv.kv_hbm, ids({out, sv.kv_d2h}));
    sv.kv_hbm = -1;
  }
  if (!acts_hbm_) keep_activations(t, v, sv, out);
  if (l == L_ - 1) keep_head_hidden(t, v, out);
}

// Forward attention of chunk k: its K/V go to host DRAM (kv dram), the causal diagonal block, then the earlier
// chunks' K/V, in HBM in one call or streamed back in blocks through `prefetch` buffers, and the merge.
void RingTrackBuilder::forward_attention(Train& t, const VisitAt& v, Saved& sv, std::vector<sim::TaskId>& stream_buffers, const std::string& an,
                                         std::vector<sim::TaskId>& last, bool rec) {
  const int l = v.l, k = v.k;
  if (kv_dram_) {
    sv.kv_host = g_.set_op(g_.alloc(an + " host kv", v.host, sim::Pool::dram, bytes(kv_chunk_), "K/V in host DRAM", ids({last[0]})),
                           t.kv(sim::OpCode::kv, l, k, k, k));
    sv.kv_d2h = g_.set_op(g_.copy(an + " D2H kv", v.gpu, {sim::Copy::Direction::d2h, bytes(kv_chunk_), true}, ids({sv.kv_host, last[0]})),
                          t.kv(sim::OpCode::kv, l, k, k, k));
  }
  last[0] = attend(v, an + " C" + std::to_string(k) + " x C" + std::to_string(k), t, c_, true, false, rec, k, k, ids({last[0]}));
  if (k == 0) return;
  if (!kv_dram_) {  // every earlier chunk's K/V is in HBM: one call
    last[0] = attend(v, an + " C" + std::to_string(k) + " x C0..C" + std::to_string(k - 1), t, c_ * k, false, false, rec, 0, k - 1, ids({last[0]}));
  } else {
    std::vector<sim::TaskId> blocks;
    for (int d = 0; d < std::min(p_.prefetch, (k + span_ - 1) / span_); ++d) {
      stream_buffers.push_back(g_.set_op(g_.alloc(an + " kv buffer " + std::to_string(d), v.gpu, sim::Pool::hbm,
                                                  bytes(kv_chunk_ * std::min(span_, k)), "K/V stream buffers", ids({v.prev})),
                                         t.kv(sim::OpCode::kv, l, k, 0, k - 1)));
    }
    for (int j0 = 0, b = 0; j0 < k; j0 += span_, ++b) {
      const int j1 = std::min(k, j0 + span_);
      std::vector<sim::TaskId> deps{stream_buffers[b % p_.prefetch]};
      for (int j = j0; j < j1; ++j) deps.push_back(t.saved[l][j].kv_d2h);
      if (b >= p_.prefetch) deps.push_back(blocks[b - p_.prefetch]);  // its buffer is free again
      const std::string range = "C" + std::to_string(j0) + (j1 - j0 > 1 ? "..C" + std::to_string(j1 - 1) : "");
      const sim::TaskId in_copy = g_.set_op(
          g_.copy(an + " H2D kv " + range, v.gpu, {sim::Copy::Direction::h2d, bytes(kv_chunk_ * (j1 - j0)), true}, deps),
          t.kv(sim::OpCode::kv, l, k, j0, j1 - 1));
      last[0] = attend(v, an + " C" + std::to_string(k) + " x " + range, t, c_ * (j1 - j0), false, false, rec, j0, j1 - 1, ids({last[0], in_copy}));
      blocks.push_back(last[0]);
    }
  }
  // Merge the partial outputs by their log-sum-exp.
  last[0] = g_.elementwise(an + " merge", v.gpu,
                           {bytes(2 * kBf16 * static_cast<double>(c_ * model_.q_dim())), bytes(kBf16 * static_cast<double>(c_ * model_.q_dim()))},
                           ids({last[0]}), 0);
  g_.set_op(last[0], t.at(sim::OpCode::attn_merge, l, k));
}

// Activations to host DRAM: everything kept, or only what recompute needs.
void RingTrackBuilder::keep_activations(Train& t, const VisitAt& v, Saved& sv, sim::TaskId out) {
  const double out_bytes = recompute_ ? checkpoint_ : kept_;
  const sim::Op kept_op = t.at(recompute_ ? sim::OpCode::checkpoint : sim::OpCode::acts, v.l, v.k);
  sv.host = g_.set_op(g_.alloc(v.name + " host activations", v.host, sim::Pool::dram, bytes(out_bytes),
                               recompute_ ? "checkpoints in host DRAM" : "activations in host DRAM", ids({out})),
                      kept_op);
  const sim::TaskId d2h = g_.set_op(g_.copy(v.name + " D2H activations", v.gpu, {sim::Copy::Direction::d2h, bytes(out_bytes), true}, ids({sv.host})),
                                    kept_op);
  sv.host_d2h = d2h;
  g_.free(v.name + " free activations", sv.work, ids({d2h}));
  sv.work = -1;
}

// The LM head's stop keeps the final hidden state of the chunk until its backward.
void RingTrackBuilder::keep_head_hidden(Train& t, const VisitAt& v, sim::TaskId out) {
  const int k = v.k;
  const int head_gpu = gpu_of(t.r, L_);
  Saved& hs = t.saved[L_][k];
  const std::string hname = "F" + t.seq_tag + " head C" + std::to_string(k);
  const sim::Op hidden = t.at(sim::OpCode::input, L_, k);
  hs.out = arrive(out, v.gpu, head_gpu, hname + " recv hidden", hidden);
  if (acts_hbm_) {
    hs.work = g_.set_op(g_.alloc(hname + " hidden", head_gpu, sim::Pool::hbm, bytes(hidden_chunk_), "final hidden states", ids({hs.out})), hidden);
    return;
  }
  hs.host = g_.set_op(
      g_.alloc(hname + " host hidden", host_of(head_gpu), sim::Pool::dram, bytes(hidden_chunk_), "final hidden states in host DRAM", ids({hs.out})),
      hidden);
  hs.out = g_.set_op(g_.copy(hname + " D2H hidden", head_gpu, {sim::Copy::Direction::d2h, bytes(hidden_chunk_), true}, ids({hs.host})), hidden);
}

// LM head and loss of chunk k, fused forward and backward.
void RingTrackBuilder::backward_head(Train& t, const VisitAt& v) {
  const int k = v.k;
  Saved& sv = t.saved[L_][k];
  const std::string name = "B" + t.seq_tag + " head C" + std::to_string(k);
  sim::TaskId ready = sv.out;
  sim::TaskId buf = sv.work;
  if (!acts_hbm_) {
    const sim::TaskId reuse = visit_end_back(v.gpu, 2);
    buf = g_.set_op(g_.alloc(name + " hidden", v.gpu, sim::Pool::hbm, bytes(hidden_chunk_), "final hidden states", ids({reuse})),
                    t.at(sim::OpCode::input, L_, k));
    ready = g_.set_op(g_.copy(name + " H2D hidden", v.gpu, {sim::Copy::Direction::h2d, bytes(hidden_chunk_), true}, ids({buf, sv.out})),
                      t.at(sim::OpCode::input, L_, k));
  }
  const auto begin_id = static_cast<sim::TaskId>(g_.size());
  const sim::TaskId done = emit_loss(g_, v.gpu, "C" + std::to_string(k) + t.seq_tag, c_, h_, model_.vocab, v.prev, t.at(sim::OpCode::none, L_, k));
  g_.add_dependency(ready, begin_id);
  g_.free(name + " free hidden", buf, ids({done}));
  if (sv.host >= 0) g_.free(name + " free host hidden", sv.host, ids({ready}));
  t.grad_out[L_][k] = arrive(done, v.gpu, gpu_of(t.r, L_ - 1),
                             "B" + t.seq_tag + " L" + std::to_string(L_ - 1) + " C" + std::to_string(k) + " recv grad",
                             t.at(sim::OpCode::input_grad, L_, k));
  gpu_last_[v.gpu] = done;
  visit_ends_[v.gpu].push_back(done);
  if (k == 0 && t.last_sequence) layer_done_[v.gpu][L_] = done;
}

void RingTrackBuilder::backward_visit(Train& t, const Visit& visit) {
  const int l = visit.stage, k = visit.chunk;
  const int gpu = gpu_of(t.r, l);
  const VisitAt v{l, k, gpu, host_of(gpu), "B" + t.seq_tag + " L" + std::to_string(l) + " C" + std::to_string(k), gpu_last_[gpu]};
  if (l == L_) return backward_head(t, v);
  Saved& sv = t.saved[l][k];
  const sim::TaskId reuse = visit_end_back(gpu, 2);  // reloads may start once the visit before last is done
  const sim::TaskId input = t.grad_out[l + 1][k];
  const auto [wbuf, wcopy] = weights_in(gpu, l, v.name);
  std::vector<sim::TaskId> ready = ids({input, wcopy});
  for (sim::TaskId id : reload(t, v, sv, reuse)) ready.push_back(id);
  if (k == chunk_count_ - 1 && chunk_count_ > 1) {  // dK/dV of every earlier chunk accumulate over this layer's backward
    t.accumulators[l] = g_.set_op(g_.alloc(v.name + " dkv accumulators", kv_dram_ ? v.host : gpu, kv_dram_ ? sim::Pool::dram : sim::Pool::hbm,
                                           bytes(acc_chunk_ * (chunk_count_ - 1)), "fp32 dK/dV accumulators", ids({v.prev})),
                                  t.kv(sim::OpCode::dkv, l, k, 0, chunk_count_ - 2));
  }
  std::vector<sim::TaskId> stream_buffers;
  // The chunk's own fp32 dK/dV (finished in this visit) and, with K/V in DRAM, the stream buffers.
  const sim::TaskId own_acc = g_.set_op(g_.alloc(v.name + " dkv", gpu, sim::Pool::hbm, bytes(acc_chunk_), "fp32 dK/dV of a chunk", ids({v.prev})),
                                        t.kv(sim::OpCode::dkv, l, k, k, k));
  LayerEmitter emitter(g_, model_, chunk_split_, {gpu});
  emitter.set_coordinates(t.seq_number, l, k);
  emitter.set_attention_hook([&](const std::string& an, bool backward, std::vector<sim::TaskId>& last, bool rec) {
    if (backward) backward_attention(t, v, own_acc, stream_buffers, an, last, rec);  // recompute keeps the attention output and lse
  });
  std::vector<sim::TaskId> chain{v.prev};
  const auto begin = static_cast<sim::TaskId>(g_.size());
  if (recompute_) emitter.forward("R" + t.seq_tag + " L" + std::to_string(l) + " C" + std::to_string(k), chain, true);
  emitter.backward(v.name, chain);
  for (sim::TaskId dep : ready) g_.add_dependency(dep, begin);
  const sim::TaskId out = chain[0];
  t.grad_out[l][k] = l > 0 ? arrive(out, gpu, gpu_of(t.r, l - 1),
                                    "B" + t.seq_tag + " L" + std::to_string(l - 1) + " C" + std::to_string(k) + " recv grad",
                                    t.at(sim::OpCode::input_grad, l, k))
                           : out;
  gpu_last_[gpu] = out;
  visit_ends_[gpu].push_back(out);
  release_after_backward(t, v, sv, out, own_acc, wbuf, stream_buffers);
}

// What forward kept, back for backward: the activations (reloaded from DRAM, or the checkpoint to recompute from)
// and K/V. Returns the copies the visit waits for.
std::vector<sim::TaskId> RingTrackBuilder::reload(Train& t, const VisitAt& v, Saved& sv, sim::TaskId reuse) {
  std::vector<sim::TaskId> ready;
  const int l = v.l, k = v.k;
  if (!acts_hbm_) {
    sv.work = g_.set_op(g_.alloc(v.name + " activations", v.gpu, sim::Pool::hbm, bytes(kept_), "activations of a chunk", ids({reuse})),
                        t.at(sim::OpCode::acts, l, k));
    const double in_bytes = recompute_ ? checkpoint_ : kept_;
    ready.push_back(
        g_.set_op(g_.copy(v.name + " H2D activations", v.gpu, {sim::Copy::Direction::h2d, bytes(in_bytes), true}, ids({sv.work, sv.host_d2h})),
                  t.at(recompute_ ? sim::OpCode::checkpoint : sim::OpCode::acts, l, k)));
  }
  if (kv_dram_) {
    sv.kv_hbm = g_.set_op(g_.alloc(v.name + " kv", v.gpu, sim::Pool::hbm, bytes(kv_chunk_), "K/V of a chunk", ids({reuse})),
                          t.kv(sim::OpCode::kv, l, k, k, k));
    if (!recompute_) {  // recompute produces this chunk's K/V again
      ready.push_back(g_.set_op(g_.copy(v.name + " H2D kv", v.gpu, {sim::Copy::Direction::h2d, bytes(kv_chunk_), true}, ids({sv.kv_hbm, sv.kv_d2h})),
                                t.kv(sim::OpCode::kv, l, k, k, k)));
    }
  }
  return ready;
}

// Backward attention of chunk k: the diagonal block (with K/V in DRAM this chunk's accumulated dK/dV come in
// first; nothing to read for the last chunk), then the earlier chunks' blocks, in HBM in one call or streamed with
// a read-modify-write of their dK/dV accumulators.
void RingTrackBuilder::backward_attention(Train& t, const VisitAt& v, sim::TaskId own_acc, std::vector<sim::TaskId>& stream_buffers,
                                          const std::string& an, std::vector<sim::TaskId>& last, bool rec) {
  const int l = v.l, k = v.k;
  auto& written = t.acc_written[l];
  sim::TaskId acc_in = -1;
  if (kv_dram_ && k < chunk_count_ - 1) {
    acc_in = g_.set_op(g_.copy(an + " H2D dkv C" + std::to_string(k), v.gpu, {sim::Copy::Direction::h2d, bytes(acc_chunk_), true},
                               ids({own_acc, written.empty() ? -1 : written[k / span_]})),
                       t.kv(sim::OpCode::dkv, l, k, k, k));
  }
  last[0] = attend(v, an + " C" + std::to_string(k) + " x C" + std::to_string(k), t, c_, true, true, rec, k, k, ids({last[0], acc_in}));
  if (k == 0) return;
  if (!kv_dram_) {
    last[0] = attend(v, an + " C" + std::to_string(k) + " x C0..C" + std::to_string(k - 1), t, c_ * k, false, true, rec, 0, k - 1, ids({last[0]}));
    return;
  }
  const int nblocks = (k + span_ - 1) / span_;
  for (int d = 0; d < std::min(p_.prefetch, nblocks); ++d) {
    stream_buffers.push_back(g_.set_op(g_.alloc(an + " kv dkv buffer " + std::to_string(d), v.gpu, sim::Pool::hbm,
                                                bytes((kv_chunk_ + acc_chunk_) * std::min(span_, k)), "K/V and dK/dV stream buffers", ids({v.prev})),
                                       t.kv(sim::OpCode::kv_dkv, l, k, 0, k - 1)));
  }
  std::vector<sim::TaskId> blocks, now_written;
  for (int j0 = 0, b = 0; j0 < k; j0 += span_, ++b) {
    const int j1 = std::min(k, j0 + span_);
    const std::string range = "C" + std::to_string(j0) + (j1 - j0 > 1 ? "..C" + std::to_string(j1 - 1) : "");
    std::vector<sim::TaskId> deps{stream_buffers[b % p_.prefetch]};
    if (b >= p_.prefetch) {  // the buffer is free again once its last block is computed and its dK/dV copied out
      deps.push_back(blocks[b - p_.prefetch]);
      deps.push_back(now_written[b - p_.prefetch]);
    }
    for (int j = j0; j < j1; ++j) deps.push_back(t.saved[l][j].kv_d2h);  // forward wrote them
    const sim::TaskId kv_in = g_.set_op(
        g_.copy(an + " H2D kv " + range, v.gpu, {sim::Copy::Direction::h2d, bytes(kv_chunk_ * (j1 - j0)), true}, deps),
        t.kv(sim::OpCode::kv, l, k, j0, j1 - 1));
    std::vector<sim::TaskId> block_deps{last[0], kv_in};
    if (k < chunk_count_ - 1) {  // read-modify-write of the accumulators (the last chunk writes them first)
      if (static_cast<std::size_t>(b) < written.size()) deps.push_back(written[b]);
      block_deps.push_back(g_.set_op(g_.copy(an + " H2D dkv " + range, v.gpu, {sim::Copy::Direction::h2d, bytes(acc_chunk_ * (j1 - j0)), true}, deps),
                                     t.kv(sim::OpCode::dkv, l, k, j0, j1 - 1)));
    }
    last[0] = attend(v, an + " C" + std::to_string(k) + " x " + range, t, c_ * (j1 - j0), false, true, rec, j0, j1 - 1, block_deps);
    blocks.push_back(last[0]);
    now_written.push_back(
        g_.set_op(g_.copy(an + " D2H dkv " + range, v.gpu, {sim::Copy::Direction::d2h, bytes(acc_chunk_ * (j1 - j0)), true}, ids({last[0]})),
                  t.kv(sim::OpCode::dkv, l, k, j0, j1 - 1)));
  }
  written = now_written;
}

// After a backward visit: its buffers are released, streamed weight gradients go to the host, layer 0 runs the
// embedding's backward, and the layer's dK/dV accumulators go once its last chunk (k = 0) is done.
void RingTrackBuilder::release_after_backward(Train& t, const VisitAt& v, Saved& sv, sim::TaskId out, sim::TaskId own_acc, sim::TaskId wbuf,
                                              const std::vector<sim::TaskId>& stream_buffers) {
  const int l = v.l, k = v.k, gpu = v.gpu;
  const auto& written = t.acc_written[l];
  if (!stream_buffers.empty()) {  // the buffers are read until the last dK/dV block is back in host DRAM
    std::vector<sim::TaskId> deps{out};
    deps.insert(deps.end(), written.begin(), written.end());
    for (auto buf : stream_buffers) g_.free(v.name + " free buffer", buf, deps);
  }
  g_.free(v.name + " free dkv", own_acc, ids({out}));
  if (wbuf >= 0) g_.free(v.name + " free weights buffer", wbuf, ids({out}));
  if (sv.work >= 0) g_.free(v.name + " free activations", sv.work, ids({out}));
  if (sv.kv_hbm >= 0) g_.free(v.name + " free kv", sv.kv_hbm, ids({out}));
  if (sv.kv_host >= 0) g_.free(v.name + " free host kv", sv.kv_host, ids({out}));
  if (sv.host >= 0) g_.free(v.name + " free host activations", sv.host, ids({out}));
  if (stream_weights_) {  // this visit's weight gradients go to the host and are added there
    const double grad_bytes = pol_.grad_bytes * layer_params_;
    const sim::TaskId d2h = g_.set_op(g_.copy(v.name + " D2H weight grads", gpu, {sim::Copy::Direction::d2h, bytes(grad_bytes), true}, ids({out})),
                                      sim::Op::gradients(l, l, false, false));
    grads_ready_[gpu].push_back(g_.add(v.name + " host accumulate grads",
                                       {v.host,
                                        {sim::StreamKind::host, 0},
                                        false,
                                        sim::OptimizerStep{bytes(grad_bytes + 2 * pol_.grad_bytes * layer_params_)},
                                        sim::Op::host_gradient_sum(l, gpu)},
                                       ids({d2h})));
  }
  if (l == 0) {
    gpu_last_[gpu] = emit_embedding(g_, gpu, "B" + t.seq_tag + " C" + std::to_string(k) + " embedding", c_, h_, true, out,
                                    t.at(sim::OpCode::embed_bwd, 0, k));
    if (k == 0 && t.last_sequence) layer_done_[gpu][L_ + 1] = gpu_last_[gpu];
  }
  if (k != 0) return;  // layer l's backward is complete for this sequence
  if (t.accumulators[l] >= 0) {
    std::vector<sim::TaskId> deps{out};
    for (auto id : written) deps.push_back(id);
    g_.free(v.name + " free dkv accumulators", t.accumulators[l], deps);
  }
  if (t.last_sequence) layer_done_[gpu][l] = out;
}

// Per ring position: all-reduce each layer's gradients (then the LM head's and the embedding's) across the replicas
// as soon as that part's backward is complete everywhere (overlapped with the rest of backward).
void RingTrackBuilder::reduce_gradients() {
  if (replicas_ <= 1) return;
  for (int pos = 0; pos < P_; ++pos) {
    std::vector<sim::DeviceId> members;
    for (int r = 0; r < replicas_; ++r) members.push_back(plan_.rings[r][pos]);
    const std::int32_t group = g_.add_group(members);
    for (int l = 0; l < L_ + 2; ++l) {
      const bool head = l == L_, embedding = l == L_ + 1;
      if (schedule_.stage_position[embedding ? 0 : l] != pos) continue;
      std::vector<sim::TaskId> deps;
      for (auto m : members) {
        deps.push_back(layer_done_[m][l]);
        for (auto id : grads_ready_[m]) deps.push_back(id);  // streamed: the host's sums
      }
      const double grad_bytes = pol_.grad_bytes * (head ? head_params_ : embedding ? embedding_params_ : layer_params_);
      const std::string part = head ? "head" : embedding ? "embedding" : "L" + std::to_string(l);
      const sim::TaskId ar = g_.set_op(
          g_.collective("all-reduce grads " + part,
                        {sim::CollectiveOp::all_reduce, sim::Algorithm::ring, group, (bytes(grad_bytes) + replicas_ - 1) / replicas_ * replicas_},
                        deps, kReduceStream),
          sim::Op::gradients(head || embedding ? 0 : l, head || embedding ? -1 : l, head, embedding));
      for (auto m : members) reduced_[m].push_back(ar);
    }
  }
}

// The optimizer step where the states live, after everything on the GPU (its compute stream is in order) and its
// reductions; from host DRAM the updated weights come back.
void RingTrackBuilder::optimizer_steps() {
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    const auto& ring = plan_.rings[gpu / P_];
    const int pos = static_cast<int>(std::find(ring.begin(), ring.end(), gpu) - ring.begin());
    const double owned = owned_params_[pos];
    std::vector<sim::TaskId> deps = reduced_[gpu];
    for (sim::TaskId id = static_cast<sim::TaskId>(g_.size()) - 1; id >= 0; --id) {
      const auto& task = g_.task(id);
      if (task.device == gpu && task.stream.kind == sim::StreamKind::compute) {
        deps.push_back(id);
        break;
      }
    }
    const auto opt_bytes = bytes(owned * kAdamBytesPerParam);
    if (!states_dram_) {
      g_.add("optimizer step gpu" + std::to_string(gpu),
             {gpu, {sim::StreamKind::compute, 0}, false, sim::OptimizerStep{opt_bytes}, sim::Op::optimizer_of(gpu)}, deps);
      continue;
    }
    std::vector<sim::TaskId> host_deps = deps;
    if (!stream_weights_) {
      // The GPU's gradients (those of every group it holds) out to the host's optimizer step.
      host_deps = {
          g_.set_op(g_.copy("D2H grads gpu" + std::to_string(gpu), gpu, {sim::Copy::Direction::d2h, bytes(pol_.grad_bytes * owned), true}, deps),
                    sim::Op::gradients(0, L_ - 1, true, true))};
    } else {  // the host's sums of this GPU's per-visit gradients, and the resident embedding's or head's out
      for (auto id : grads_ready_[gpu]) host_deps.push_back(id);
      if (resident_params_[pos] > 0) {
        const bool head = schedule_.stage_position[L_] == pos, embedding = schedule_.stage_position[0] == pos;
        host_deps.push_back(g_.set_op(g_.copy("D2H resident grads gpu" + std::to_string(gpu), gpu,
                                              {sim::Copy::Direction::d2h, bytes(pol_.grad_bytes * resident_params_[pos]), true}, deps),
                                      sim::Op::gradients(0, -1, head, embedding)));
      }
    }
    const sim::TaskId step = g_.add("optimizer step host for gpu" + std::to_string(gpu),
                                    {host_of(gpu), {sim::StreamKind::host, 0}, false, sim::OptimizerStep{opt_bytes}, sim::Op::optimizer_of(gpu)},
                                    host_deps);
    // The updated weights back: all of them, or (streamed) the resident embedding's or head's; the streamed layers'
    // come in with the next step's visits.
    const double back = stream_weights_ ? resident_params_[pos] : owned;
    if (back > 0) {
      g_.set_op(g_.copy("H2D updated weights gpu" + std::to_string(gpu), gpu, {sim::Copy::Direction::h2d, bytes(pol_.weight_bytes * back), true},
                        ids({step})),
                sim::Op::updated_weights_of(gpu));
    }
  }
}

}  // namespace

RingTrackPlan build_ringtrack(const StepInputs& in, const RingTrackParams& p) {
  check_ringtrack(in, p);
  return RingTrackBuilder(in, p).build();
}

}  // namespace trainyard::planner
