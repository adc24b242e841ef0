#include "planner/schemes/megatron/megatron.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>

#include "common/error.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/megatron/closed_form.hpp"

namespace trainyard::planner {

namespace {

constexpr int kPipeStream = 1, kDpStream = 2;  // comm 0: the TP collectives (LayerEmitter)

std::string mb_name(std::int64_t mb) { return "mb" + std::to_string(mb); }

}  // namespace

std::int64_t megatron_micro_batches(const StepInputs& in, const MegatronParams& p) { return in.workload.global_batch / (p.dp * p.micro_batch); }

double megatron_state_bytes_per_param(const model::PrecisionPolicy& pol, const MegatronParams& p) {
  const int grad_ring = p.whole_dp() * p.whole_cp();
  return p.distributed_optimizer ? pol.weight_bytes + pol.grad_bytes + (pol.master_bytes + pol.optimizer_bytes) / grad_ring : pol.bytes_per_param();
}

LayerSplit megatron_layer_split(const StepInputs& in, const MegatronParams& p) {
  LayerSplit split{p.micro_batch, in.workload.seq_len, p.tp, p.sequence_parallel, false};
  split.tp_comm_overlap = p.tp_comm_overlap;
  split.cp = p.whole_cp();
  if (p.cp_represented > 0) split.cp_ranks = p.cp;
  split.tp_ranks = p.tp_built;
  split.zigzag = split.cp > 1;  // Megatron always load-balances causal CP (two chunks per rank)
  split.cp_comm = p.cp_comm;
  if (p.cp_comm == CpComm::a2a_p2p) split.cp_a2a = p.cp_a2a;
  if (split.cp == 1) split.score_bytes = stored_score_bytes(in.cluster);  // CP attention is fused
  split.recompute_attention = p.recompute == Recompute::selective;
  return split;
}

std::vector<std::int64_t> megatron_stage_layers(std::int64_t layers, const MegatronParams& p) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(p.pp), 0);
  if (p.pp == 1) {
    out[0] = layers;
    return out;
  }
  const std::int64_t first = p.first_stage_layers, last = p.last_stage_layers;
  const int middle_stages = p.pp - (first > 0) - (last > 0);
  const std::int64_t rest = layers - first - last;
  const std::int64_t each = middle_stages > 0 ? rest / middle_stages : 0;
  for (int s = 0; s < p.pp; ++s) out[s] = each;
  if (first > 0) out.front() = first;
  if (last > 0) out.back() = last;
  return out;
}

// A stage whose layers do not divide by vpp gives its earlier chunks one layer more, as Megatron's
// --pipeline-model-parallel-layout can state it (7 layers in 2 chunks: 4 then 3).
std::vector<std::int64_t> megatron_chunk_first_layers(std::int64_t layers, const MegatronParams& p) {
  const std::vector<std::int64_t> stage_layers = megatron_stage_layers(layers, p);
  std::vector<std::int64_t> first{0};
  for (int v = 0; v < p.pp * p.vpp; ++v) {
    const std::int64_t on_stage = stage_layers[v % p.pp];
    const int chunk = v / p.pp;
    first.push_back(first.back() + on_stage / p.vpp + (chunk < on_stage % p.vpp ? 1 : 0));
  }
  return first;
}

namespace {
void check_megatron_stages(const model::ModelConfig& m, const MegatronParams& p) {
  auto fail = [](const std::string& flag, const std::string& expected, const std::string& got) { throw InputError(flag, "value", expected, got); };
  if (p.first_stage_layers < 0 || p.last_stage_layers < 0) {
    fail("--first-stage-layers/--last-stage-layers", "0 (an even split) or a layer count", "a negative count");
  }
  if ((p.first_stage_layers > 0 || p.last_stage_layers > 0) && p.pp < 2) {
    fail("--first-stage-layers/--last-stage-layers", "only with --pp 2 or more", "--pp " + std::to_string(p.pp));
  }
  const int middle_stages = p.pp - (p.first_stage_layers > 0) - (p.last_stage_layers > 0);
  const std::int64_t rest = m.layers - p.first_stage_layers - p.last_stage_layers;
  const bool even = middle_stages > 0 ? rest > 0 && rest % middle_stages == 0 : rest == 0;
  if (!even) {
    fail("--pp/--first-stage-layers/--last-stage-layers",
         "the model's " + std::to_string(m.layers) + " layers less the first and last stages' split evenly over the other stages",
         std::to_string(rest) + " layers over " + std::to_string(middle_stages) + " stages");
  }
  for (std::int64_t n : megatron_stage_layers(m.layers, p)) {
    if (n < p.vpp) {
      fail("--vpp", "at most every stage's layer count (" + std::to_string(n) + " on one stage): each model chunk holds a layer",
           std::to_string(p.vpp));
    }
  }
}
}  // namespace

void check_megatron(const StepInputs& in, const MegatronParams& p) {
  const auto& m = in.model;
  const int gpus = in.cluster.gpus();
  auto fail = [](const std::string& flag, const std::string& expected, const std::string& got) { throw InputError(flag, "value", expected, got); };
  if (p.tp < 1 || p.pp < 1 || p.dp < 1 || p.cp < 1 || p.vpp < 1 || p.micro_batch < 1) {
    fail("--tp/--pp/--dp/--cp/--vpp/--micro-batch", "positive integers", "a value below 1");
  }
  if (p.tp_built != 0 && (p.tp_built < 1 || p.tp % p.tp_built != 0)) fail("tp_built", "0 or a divisor of tp", std::to_string(p.tp_built));
  const int tp = p.built_tp();  // the cluster holds the built ranks only
  if (static_cast<std::int64_t>(tp) * p.pp * p.dp * p.cp != gpus) {
    fail("--tp/--pp/--dp/--cp", "tp * pp * dp * cp = the cluster's " + std::to_string(gpus) + " GPUs",
         std::to_string(tp) + " * " + std::to_string(p.pp) + " * " + std::to_string(p.dp) + " * " + std::to_string(p.cp) + " = " +
             std::to_string(static_cast<std::int64_t>(tp) * p.pp * p.dp * p.cp));
  }
  if (p.whole_cp() > 1 && in.workload.seq_len % (2 * p.whole_cp()) != 0) {
    fail("--cp", "a degree whose 2 * cp chunks divide the sequence (" + std::to_string(in.workload.seq_len) + " tokens)",
         std::to_string(p.whole_cp()));
  }
  if (p.cp_comm != CpComm::p2p && p.cp == 1) fail("--cp-comm", "p2p unless --cp > 1", std::string(to_string(p.cp_comm)));
  if (p.cp_comm == CpComm::a2a_p2p && (p.cp_a2a < 2 || p.cp_a2a >= p.cp || p.cp % p.cp_a2a != 0)) {
    fail("--cp-a2a",
         "with --cp-comm a2a+p2p, an all-to-all group size of at least 2 that divides --cp (" + std::to_string(p.cp) + ") into at least 2 groups",
         std::to_string(p.cp_a2a));
  }
  if (p.cp_comm != CpComm::a2a_p2p && p.cp_a2a != 0) {
    fail("--cp-a2a", "only with --cp-comm a2a+p2p", std::to_string(p.cp_a2a) + " with --cp-comm " + std::string(to_string(p.cp_comm)));
  }
  if (p.cp_comm == CpComm::a2a || p.cp_comm == CpComm::a2a_p2p) {  // the all-to-all splits each TP rank's heads
    const int a2a = p.cp_comm == CpComm::a2a ? p.cp : p.cp_a2a;
    const std::string flag = p.cp_comm == CpComm::a2a ? "--cp" : "--cp-a2a";
    const std::int64_t heads_per_tp = m.heads / p.tp, kv_per_tp = std::max<std::int64_t>(1, m.kv_heads / p.tp);
    if (heads_per_tp % a2a != 0 || (kv_per_tp >= a2a && kv_per_tp % a2a != 0) || (kv_per_tp < a2a && a2a % kv_per_tp != 0)) {
      fail(flag,
           "with --cp-comm " + std::string(to_string(p.cp_comm)) + ", an all-to-all size dividing each TP rank's heads (" +
               std::to_string(heads_per_tp) + ") and K/V heads (" + std::to_string(kv_per_tp) + ", or a multiple of them: replicated)",
           std::to_string(a2a));
    }
  }
  if ((p.dp_represented != 0 && p.dp_represented < p.dp) || (p.cp_represented != 0 && p.cp_represented < p.cp)) {
    fail("dp_represented/cp_represented", "0 or at least dp and cp", std::to_string(p.dp_represented) + "/" + std::to_string(p.cp_represented));
  }
  // A TP group either fits inside a node or spans whole nodes (as HotSPa's TP 16 on 8-GPU nodes does: its
  // collectives then cross the network).
  const int per_node = in.cluster.topology.gpus_per_node();
  if (per_node % p.tp != 0 && p.tp % per_node != 0) {
    fail("--tp",
         "a divisor or a multiple of the GPUs per node (" + std::to_string(per_node) +
             "): a tensor-parallel group stays inside a node or spans whole nodes",
         std::to_string(p.tp));
  }
  if (m.heads % p.tp != 0) fail("--tp", "a divisor of the model's heads (" + std::to_string(m.heads) + ")", std::to_string(p.tp));
  if (m.ffn_hidden % p.tp != 0) fail("--tp", "a divisor of ffn_hidden (" + std::to_string(m.ffn_hidden) + ")", std::to_string(p.tp));
  if (p.first_stage_layers == 0 && p.last_stage_layers == 0 && m.layers % (p.pp * p.vpp) != 0) {
    fail("--pp/--vpp",
         "pp * vpp dividing the model's " + std::to_string(m.layers) + " layers (or an uneven split: --first-stage-layers, --last-stage-layers)",
         std::to_string(p.pp) + " * " + std::to_string(p.vpp));
  }
  check_megatron_stages(m, p);
  if (p.vpp > 1 && p.pp == 1) fail("--vpp", "1 unless --pp > 1 (interleaving needs a pipeline)", std::to_string(p.vpp));
  if (p.sequence_parallel && p.tp == 1) fail("--sequence-parallel", "only with --tp > 1", "--tp 1");
  if (p.tp_comm_overlap && !p.sequence_parallel)
    fail("--tp-comm-overlap", "only with --sequence-parallel (as Megatron requires)", "no --sequence-parallel");
  if (p.offload_activations && p.recompute != Recompute::full) {
    fail("--offload", "acts only with --recompute full (the offloaded checkpoints are the layer inputs)", "acts");
  }
  if (in.workload.global_batch % (p.dp * p.micro_batch) != 0) {
    fail("--global-batch", "a multiple of dp * micro-batch (" + std::to_string(p.dp * p.micro_batch) + ")", std::to_string(in.workload.global_batch));
  }
  const std::int64_t mbs = megatron_micro_batches(in, p);
  if (p.vpp > 1 && mbs % p.pp != 0) {
    fail("--vpp", "micro-batches per step (" + std::to_string(mbs) + ") a multiple of pp for the interleaved schedule", std::to_string(p.vpp));
  }
}

std::vector<PipelineSlot> pipeline_schedule(int stage, int pp, std::int64_t micro_batches, int vpp) {
  std::vector<PipelineSlot> out;
  const std::int64_t total = micro_batches * vpp;
  std::int64_t warmup = vpp == 1 ? std::min<std::int64_t>(pp - stage - 1, micro_batches)
                                 : std::min<std::int64_t>(2 * (pp - stage - 1) + (vpp - 1) * pp, total);
  // Megatron's interleaved order: virtual micro-batch k runs chunk (k / pp) % vpp of micro-batch
  // (k / (pp * vpp)) * pp + k % pp; backward visits the chunks in reverse.
  auto slot = [&](std::int64_t k, bool forward) {
    if (vpp == 1) return PipelineSlot{forward, k, 0};
    const int chunk = static_cast<int>((k / pp) % vpp);
    return PipelineSlot{forward, (k / (pp * vpp)) * pp + k % pp, forward ? chunk : vpp - 1 - chunk};
  };
  for (std::int64_t k = 0; k < warmup; ++k) out.push_back(slot(k, true));
  for (std::int64_t i = 0; i < total - warmup; ++i) {
    out.push_back(slot(warmup + i, true));
    out.push_back(slot(i, false));
  }
  for (std::int64_t i = total - warmup; i < total; ++i) out.push_back(slot(i, false));
  return out;
}

namespace {

// Builds one Megatron step. Its state is the members; its phases the methods build() calls in order: the model
// states, every pipeline slot of every replica and stage (forward or backward, cutting gradient buckets as the
// last backward of each chunk completes them), the pipeline edges between slots, then the data-parallel
// reduction, the optimizer step and, with the distributed optimizer, the weights' all-gather.
class MegatronBuilder {
 public:
  MegatronBuilder(const StepInputs& in, const MegatronParams& p);
  sim::TaskGraph build();

 private:
  struct SlotTasks {
    std::vector<sim::TaskId> first, last, send;  // per TP rank
  };
  struct Bucket {
    int stage, t;
    double params;
    std::vector<sim::TaskId> ready;  // per replica and cp index
    // What it carries, for the executors (sim::Op::gradients): layers first_layer..last_layer, the head's, the embedding's.
    std::int64_t first_layer = 0, last_layer = -1;
    bool head = false, embedding = false;
  };
  // One replica's pipeline stage as its schedule is walked.
  struct StageWalk {
    int d, stage;
    std::vector<sim::DeviceId> ranks;
    LayerEmitter layer;
    std::vector<std::int64_t> last_backward_mb;  // per chunk: its last backward completes its gradients
    int bucket_index = 0;
    double bucket_params = 0;
    std::int64_t bucket_top_layer = -1;  // the open bucket's first (highest) layer: backward runs layers downwards
  };
  // One slot of the schedule: what its tasks are in the model's terms (sim::Op) and where their chains end.
  struct Slot {
    int v;                          // virtual stage
    std::int64_t mb;                // micro-batch
    std::string tag;                // "mb3"
    std::int32_t seq;               // the step's sequence number of the micro-batch's first sequence
    std::vector<sim::TaskId> last;  // per rank
    sim::Op at(sim::OpCode code, std::int64_t l) const { return {code, seq, static_cast<std::int32_t>(l), 0}; }
  };

  int gpu_of(int stage, int d, int r) const { return (stage * p_.dp + d) * stage_ranks_ + r; }  // r: cp index * tp_ + TP index
  std::vector<sim::DeviceId> ranks_of(int stage, int d) const;
  std::vector<sim::DeviceId> grad_group(int stage, int t) const;  // the dp x cp ranks of (stage, TP index t), replica-major
  std::int64_t chunk_layers(int v) const { return first_layer_[static_cast<std::size_t>(v) + 1] - first_layer_[v]; }
  SlotTasks& tasks_of(int d, int v, std::int64_t mb, bool forward) { return slots_[d][v][mb][forward ? 0 : 1]; }
  std::vector<sim::TaskId> transient(const std::vector<sim::DeviceId>& ranks, const std::string& name, std::vector<sim::TaskId>& last);

  void model_states();
  void walk_stage(int d, int stage);
  void forward_slot(StageWalk& w, Slot& slot, SlotTasks& tasks);
  void forward_layer(StageWalk& w, Slot& slot, std::int64_t l);
  void backward_slot(StageWalk& w, Slot& slot, SlotTasks& tasks);
  void backward_layer(StageWalk& w, Slot& slot, std::int64_t l);
  void cut_bucket(StageWalk& w, const Slot& slot, std::int64_t l);
  void send_to(StageWalk& w, const Slot& slot, SlotTasks& tasks, int to_v, bool forward);
  void link_pipeline();
  std::vector<std::vector<sim::TaskId>> reduce_gradients();
  void reduce_data_parallel(std::vector<std::vector<sim::TaskId>>& gpu_reductions);
  void reduce_tied_embeddings(std::vector<std::vector<sim::TaskId>>& gpu_reductions);
  void optimizer_steps(const std::vector<std::vector<sim::TaskId>>& reductions);

  const StepInputs& in_;
  const MegatronParams& p_;
  const model::ModelConfig& model_;
  const stacks::StackProfile::CheckpointOffload& offload_;  // how --offload acts copies run
  const std::int64_t mbs_;
  const int virtual_stages_;
  // Virtual stage v (chunk v / pp of stage v % pp) holds layers [first_layer_[v], first_layer_[v + 1]).
  const std::vector<std::int64_t> stage_layers_, first_layer_;
  const LayerSplit split_;
  const double act_per_layer_, full_layer_;
  const bool full_recompute_;
  const model::ParamCounts params_;
  const double layer_params_;
  const std::int64_t s_, h_, vocab_shard_;  // one rank's tokens of the micro-batch (1/cp of them); hidden; vocab / tp
  const int tp_;                            // TP ranks built per group (all tp unless reduced by symmetry)
  const int stage_ranks_;                   // cp x tp_
  // The ranks holding the same weights, over which gradients are reduced: built here (grad_group), and in the
  // whole data-parallel ring the built ones stand for (symmetry reduction).
  const int grad_replicas_, grad_ring_;
  const std::int32_t ring_ranks_;
  // Under symmetry the gradient ring crosses nodes (reduced replicas and CP ranks fill whole nodes): a lone
  // built member loops through the network (sim::Collective::ring_across_nodes).
  const bool ring_across_nodes_;

  sim::TaskGraph g_;
  std::vector<double> gpu_params_;
  // [replica][virtual stage][micro-batch][forward = 0, backward = 1]
  std::vector<std::vector<std::vector<std::array<SlotTasks, 2>>>> slots_;
  std::map<std::tuple<int, int, int>, Bucket> buckets_;  // (stage, tp index, bucket index), in creation order below
  std::vector<std::tuple<int, int, int>> bucket_order_;
  std::vector<sim::TaskId> last_compute_;
  // Offloaded checkpoints: the D2H of each (replica, layer, micro-batch, TP rank), which the reload waits for.
  std::map<std::tuple<int, std::int64_t, std::int64_t, std::size_t>, sim::TaskId> checkpoint_d2h_;
};

MegatronBuilder::MegatronBuilder(const StepInputs& in, const MegatronParams& p)
    : in_(in),
      p_(p),
      model_(in.model),
      offload_(in.cluster.stack.checkpoint_offload),
      mbs_(megatron_micro_batches(in, p)),
      virtual_stages_(p.pp * p.vpp),
      stage_layers_(megatron_stage_layers(in.model.layers, p)),
      first_layer_(megatron_chunk_first_layers(in.model.layers, p)),
      split_(megatron_layer_split(in, p)),
      act_per_layer_(layer_activation_bytes(in.model, split_, p.recompute).total()),
      full_layer_(layer_activation_bytes(in.model, split_, Recompute::none).total()),
      full_recompute_(p.recompute == Recompute::full),
      params_(in.model.param_counts()),
      layer_params_(params_.per_layer() / p.tp),
      s_(split_.local_tokens()),
      h_(in.model.hidden),
      vocab_shard_((in.model.vocab + p.tp - 1) / p.tp),
      tp_(p.built_tp()),
      stage_ranks_(p.cp * tp_),
      grad_replicas_(p.dp * p.cp),
      grad_ring_(p.whole_dp() * p.whole_cp()),
      ring_ranks_(grad_ring_ > grad_replicas_ ? grad_ring_ : 0),
      ring_across_nodes_(ring_ranks_ != 0),
      gpu_params_(static_cast<std::size_t>(in.cluster.gpus()), 0),
      slots_(static_cast<std::size_t>(p.dp),
             std::vector<std::vector<std::array<SlotTasks, 2>>>(static_cast<std::size_t>(virtual_stages_),
                                                                std::vector<std::array<SlotTasks, 2>>(static_cast<std::size_t>(mbs_)))),
      last_compute_(static_cast<std::size_t>(in.cluster.gpus()), -1) {}

std::vector<sim::DeviceId> MegatronBuilder::ranks_of(int stage, int d) const {
  std::vector<sim::DeviceId> r;
  for (int i = 0; i < stage_ranks_; ++i) r.push_back(gpu_of(stage, d, i));
  return r;
}

std::vector<sim::DeviceId> MegatronBuilder::grad_group(int stage, int t) const {
  std::vector<sim::DeviceId> members;
  for (int d = 0; d < p_.dp; ++d) {
    for (int c = 0; c < p_.cp; ++c) members.push_back(gpu_of(stage, d, c * tp_ + t));
  }
  return members;
}

// Under full recompute a layer's whole activations exist only while its forward or backward runs.
std::vector<sim::TaskId> MegatronBuilder::transient(const std::vector<sim::DeviceId>& ranks, const std::string& name,
                                                    std::vector<sim::TaskId>& last) {
  std::vector<sim::TaskId> ids;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    std::vector<sim::TaskId> after;
    if (last[r] >= 0) after.push_back(last[r]);
    ids.push_back(g_.alloc(name + " working activations", ranks[r], sim::Pool::hbm, std::max<std::int64_t>(1, static_cast<std::int64_t>(full_layer_)),
                           "working activations " + name, after));
    last[r] = ids.back();
  }
  return ids;
}

sim::TaskGraph MegatronBuilder::build() {
  g_.reserve(static_cast<std::size_t>(megatron_tasks(in_, p_)));
  g_.set_tensor_shards(p_.tp);                 // GPU g holds TP shard g % tp: gpu_of puts a TP group's ranks side by side
  g_.set_chunk_tokens(split_.chunk_tokens());  // one chunk per sequence, a rank's share of it; zigzag (CP): two, each half of it
  g_.set_sequence_tokens(in_.workload.seq_len);
  model_states();
  for (int d = 0; d < p_.dp; ++d) {
    for (int stage = 0; stage < p_.pp; ++stage) walk_stage(d, stage);
  }
  link_pipeline();
  optimizer_steps(reduce_gradients());
  return std::move(g_);
}

// Model states, resident for the whole step.
void MegatronBuilder::model_states() {
  const double states_per_param = megatron_state_bytes_per_param(in_.precision, p_);
  for (int stage = 0; stage < p_.pp; ++stage) {
    double stage_params = layer_params_ * static_cast<double>(stage_layers_[stage]);
    if (stage == 0) stage_params += params_.embedding / p_.tp;
    if (stage == p_.pp - 1) stage_params += static_cast<double>(model_.vocab * h_) / p_.tp + params_.final_norm;
    for (int d = 0; d < p_.dp; ++d) {
      for (sim::DeviceId gpu : ranks_of(stage, d)) {
        gpu_params_[gpu] = stage_params;
        g_.set_op(g_.alloc("model states gpu" + std::to_string(gpu), gpu, sim::Pool::hbm, static_cast<std::int64_t>(stage_params * states_per_param),
                           "model states (" + in_.precision.name + ")"),
                  {sim::OpCode::states});
      }
    }
  }
}

void MegatronBuilder::walk_stage(int d, int stage) {
  StageWalk w{d, stage, ranks_of(stage, d), LayerEmitter(g_, model_, split_, ranks_of(stage, d)),
              std::vector<std::int64_t>(static_cast<std::size_t>(p_.vpp), -1)};
  const auto schedule = pipeline_schedule(stage, p_.pp, mbs_, p_.vpp);
  for (const auto& slot : schedule) {
    if (!slot.forward) w.last_backward_mb[slot.chunk] = slot.micro_batch;
  }
  for (const auto& entry : schedule) {
    const int v = entry.chunk * p_.pp + stage;
    const std::int64_t mb = entry.micro_batch;
    // The executor runs micro-batches of one sequence without TP: one chunk, the whole sequence.
    Slot slot{v, mb, mb_name(mb), static_cast<std::int32_t>((d * mbs_ + mb) * p_.micro_batch), std::vector<sim::TaskId>(w.ranks.size(), -1)};
    SlotTasks& tasks = tasks_of(d, v, mb, entry.forward);
    if (entry.forward) {
      forward_slot(w, slot, tasks);
    } else {
      backward_slot(w, slot, tasks);
    }
    tasks.last = slot.last;
    for (std::size_t r = 0; r < w.ranks.size(); ++r) last_compute_[w.ranks[r]] = slot.last[r];
  }
}

// Every slot opens with a zero-time task per rank that upstream stages' sends attach to: in forward, the
// allocation of what the slot keeps for backward.
void MegatronBuilder::forward_slot(StageWalk& w, Slot& slot, SlotTasks& tasks) {
  const int v = slot.v;
  auto& last = slot.last;
  for (std::size_t r = 0; r < w.ranks.size(); ++r) {
    // Allocated when the GPU reaches this slot (after its previous slot), not before.
    std::vector<sim::TaskId> after;
    if (last_compute_[w.ranks[r]] >= 0) after.push_back(last_compute_[w.ranks[r]]);
    // The activations this slot keeps for backward (checkpoints under full recompute; in host DRAM with checkpoint
    // offload).
    last[r] = g_.alloc(
        "F V" + std::to_string(v) + " " + slot.tag + " activations", w.ranks[r], p_.offload_activations ? sim::Pool::dram : sim::Pool::hbm,
        std::max<std::int64_t>(1, static_cast<std::int64_t>(act_per_layer_ * static_cast<double>(chunk_layers(v)))),
        (p_.offload_activations ? "offloaded checkpoints virtual stage " : "activations virtual stage ") + std::to_string(v) + " " + slot.tag, after);
    tasks.first.push_back(last[r]);
  }
  if (v == 0) {
    for (std::size_t r = 0; r < w.ranks.size(); ++r) {
      last[r] = emit_embedding(g_, w.ranks[r], "F " + slot.tag + " embedding", s_, h_, false, last[r],
                               w.layer.on_rank(slot.at(sim::OpCode::embed, 0), r));
    }
    if (p_.tp > 1) w.layer.embedding_sum("F " + slot.tag + " embedding", slot.at(sim::OpCode::embed, 0), last);
  }
  for (std::int64_t l = first_layer_[v]; l < first_layer_[static_cast<std::size_t>(v) + 1]; ++l) forward_layer(w, slot, l);
  if (v == virtual_stages_ - 1 && p_.tp > 1) {
    w.layer.vocab_parallel_loss(slot.tag, s_, vocab_shard_, slot.at(sim::OpCode::none, model_.layers), loss_memory(in_.cluster.stack), last);
  } else if (v == virtual_stages_ - 1) {
    for (std::size_t r = 0; r < w.ranks.size(); ++r) {
      last[r] = emit_loss(g_, w.ranks[r], slot.tag, s_, h_, vocab_shard_, last[r], w.layer.on_rank(slot.at(sim::OpCode::none, model_.layers), r),
                          loss_memory(in_.cluster.stack));
    }
  }
  if (v + 1 < virtual_stages_) send_to(w, slot, tasks, v + 1, true);
}

void MegatronBuilder::forward_layer(StageWalk& w, Slot& slot, std::int64_t l) {
  auto& last = slot.last;
  const std::string prefix = "F L" + std::to_string(l) + " " + slot.tag;
  const auto working = full_recompute_ ? transient(w.ranks, prefix, last) : std::vector<sim::TaskId>{};
  w.layer.set_coordinates(slot.seq, static_cast<int>(l), 0);
  w.layer.forward(prefix, last);
  for (std::size_t r = 0; r < working.size(); ++r) {
    std::vector<sim::TaskId> done{last[r]};
    if (p_.offload_activations) {  // the layer input goes to host DRAM before its buffer is released
      done.push_back(g_.copy(prefix + " D2H checkpoint", w.ranks[r],
                             {sim::Copy::Direction::d2h, std::max<std::int64_t>(1, static_cast<std::int64_t>(act_per_layer_)), offload_.pinned},
                             std::vector<sim::TaskId>{last[r]}));
      g_.set_op(done.back(), w.layer.on_rank(slot.at(sim::OpCode::input, l), r));
      checkpoint_d2h_[{w.d, l, slot.mb, r}] = done.back();
      if (offload_.blocking) last[r] = done.back();  // the next layer waits for the copy
    }
    g_.free(prefix + " release working activations", working[r], done);
  }
}

// The activations (or gradients) a slot passes to the neighbouring virtual stage, by message when that stage
// lives on another GPU (on the same one, link_pipeline joins the slots directly).
void MegatronBuilder::send_to(StageWalk& w, const Slot& slot, SlotTasks& tasks, int to_v, bool forward) {
  const int to_stage = to_v % p_.pp;
  if (to_stage == w.stage) return;
  for (std::size_t r = 0; r < w.ranks.size(); ++r) {
    tasks.send.push_back(g_.send((forward ? "F V" : "B V") + std::to_string(slot.v) + " " + slot.tag + (forward ? " send act" : " send grad"),
                                 w.ranks[r], gpu_of(to_stage, w.d, static_cast<int>(r)), std::max<std::int64_t>(1, 2 * s_ * h_ / p_.tp),
                                 std::vector<sim::TaskId>{slot.last[r]}, kPipeStream));
    const std::int64_t layer = forward ? first_layer_[static_cast<std::size_t>(slot.v) + 1] : first_layer_[slot.v];
    g_.set_op(tasks.send.back(), w.layer.on_rank(slot.at(forward ? sim::OpCode::input : sim::OpCode::input_grad, layer), r));
  }
}

void MegatronBuilder::backward_slot(StageWalk& w, Slot& slot, SlotTasks& tasks) {
  const int v = slot.v;
  auto& last = slot.last;
  const auto begin = static_cast<sim::TaskId>(g_.size());
  for (std::int64_t l = first_layer_[static_cast<std::size_t>(v) + 1] - 1; l >= first_layer_[v]; --l) {
    backward_layer(w, slot, l);
    if (slot.mb == w.last_backward_mb[v / p_.pp]) cut_bucket(w, slot, l);
  }
  if (v == 0) {
    if (p_.tp > 1) w.layer.embedding_gather("B " + slot.tag + " embedding", slot.at(sim::OpCode::embed_bwd, 0), last);
    for (std::size_t r = 0; r < w.ranks.size(); ++r) {
      last[r] = emit_embedding(g_, w.ranks[r], "B " + slot.tag + " embedding", s_, h_, true, last[r],
                               w.layer.on_rank(slot.at(sim::OpCode::embed_bwd, 0), r));
    }
    if (slot.mb == w.last_backward_mb[0]) {  // the embedding's gradients join the last bucket, after its backward
      for (int t = 0; t < tp_; ++t) {
        Bucket& b = buckets_.at(std::make_tuple(w.stage, t, w.bucket_index - 1));
        if (w.d == 0) b.params += params_.embedding / p_.tp;
        b.embedding = true;
        for (int c = 0; c < p_.cp; ++c) b.ready[b.ready.size() - static_cast<std::size_t>(p_.cp - c)] = last[c * tp_ + t];
      }
    }
  }
  // Upstream gradients attach to the slot's first task on each rank.
  for (sim::DeviceId rank : w.ranks) {
    for (auto id = begin; id < static_cast<sim::TaskId>(g_.size()); ++id) {
      if (g_.task(id).device == rank && g_.task(id).kind() != sim::TaskKind::collective) {
        tasks.first.push_back(id);
        break;
      }
    }
  }
  // Activations of this slot are no longer needed.
  const SlotTasks& fwd = tasks_of(w.d, v, slot.mb, true);
  for (std::size_t r = 0; r < w.ranks.size(); ++r) {
    g_.free("B V" + std::to_string(v) + " " + slot.tag + " free activations", fwd.first[r], std::vector<sim::TaskId>{last[r]});
  }
  if (v > 0) send_to(w, slot, tasks, v - 1, false);
}

void MegatronBuilder::backward_layer(StageWalk& w, Slot& slot, std::int64_t l) {
  auto& last = slot.last;
  const std::string prefix = "B L" + std::to_string(l) + " " + slot.tag;
  std::vector<sim::TaskId> working;
  if (full_recompute_) {
    if (p_.offload_activations) {
      for (std::size_t r = 0; r < w.ranks.size(); ++r) {
        std::vector<sim::TaskId> after{checkpoint_d2h_.at({w.d, l, slot.mb, r})};
        if (last[r] >= 0) after.push_back(last[r]);
        last[r] = g_.copy(prefix + " H2D checkpoint", w.ranks[r],
                          {sim::Copy::Direction::h2d, std::max<std::int64_t>(1, static_cast<std::int64_t>(act_per_layer_)), offload_.pinned}, after);
        g_.set_op(last[r], w.layer.on_rank(slot.at(sim::OpCode::input, l), r));
      }
    }
    working = transient(w.ranks, prefix, last);
    w.layer.set_coordinates(slot.seq, static_cast<int>(l), 0);
    w.layer.forward("R L" + std::to_string(l) + " " + slot.tag, last, true);
  }
  w.layer.set_coordinates(slot.seq, static_cast<int>(l), 0);
  w.layer.backward(prefix, last);
  for (std::size_t r = 0; r < working.size(); ++r) {
    g_.free(prefix + " release working activations", working[r], std::vector<sim::TaskId>{last[r]});
  }
}

// In the last backward of a chunk, layer l's gradients are complete: they join the open bucket, which is cut when
// it holds bucket_params or the chunk is done.
void MegatronBuilder::cut_bucket(StageWalk& w, const Slot& slot, std::int64_t l) {
  if (w.bucket_params == 0) w.bucket_top_layer = l;
  w.bucket_params += layer_params_;
  const bool chunk_done = l == first_layer_[slot.v];
  if (w.bucket_params < p_.bucket_params && !chunk_done) return;
  // The last stage's first bucket also carries the LM head's gradients (computed before any layer's).
  const double head = w.stage == p_.pp - 1 && w.bucket_index == 0 ? static_cast<double>(model_.vocab * h_) / p_.tp + params_.final_norm : 0;
  // Sequence parallelism: the bucket's norm gradients are complete once summed over each TP group.
  std::vector<sim::TaskId> done = slot.last;
  w.layer.norm_gradients_sum("B " + slot.tag + " L" + std::to_string(l) + " norm grads ar", l, w.bucket_top_layer, head > 0, done);
  for (int t = 0; t < tp_; ++t) {
    const auto key = std::make_tuple(w.stage, t, w.bucket_index);
    // Tied embeddings: the last stage's LM head is its copy of the word embeddings (with one stage, the embedding's
    // own bucket carries them once the embedding's backward has added its share).
    const bool tied_copy = head > 0 && model_.tied_embeddings && p_.pp > 1;
    auto [it, inserted] = buckets_.try_emplace(key, Bucket{w.stage, t, w.bucket_params + head, {}, l, w.bucket_top_layer, head > 0, tied_copy});
    if (inserted) bucket_order_.push_back(key);
    for (int c = 0; c < p_.cp; ++c) it->second.ready.push_back(done[c * tp_ + t]);
  }
  ++w.bucket_index;
  w.bucket_params = 0;
}

// Pipeline edges: a slot starts when its input arrives from the neighbouring virtual stage, by message when
// that stage lives on another GPU, directly when it is on the same one.
void MegatronBuilder::link_pipeline() {
  auto link = [&](const SlotTasks& upstream, const SlotTasks& slot) {
    for (std::size_t r = 0; r < slot.first.size(); ++r) g_.add_dependency(upstream.send.empty() ? upstream.last[r] : upstream.send[r], slot.first[r]);
  };
  for (int d = 0; d < p_.dp; ++d) {
    for (int v = 0; v < virtual_stages_; ++v) {
      for (std::int64_t mb = 0; mb < mbs_; ++mb) {
        if (v > 0) link(tasks_of(d, v - 1, mb, true), tasks_of(d, v, mb, true));
        if (v + 1 < virtual_stages_) {
          link(tasks_of(d, v + 1, mb, false), tasks_of(d, v, mb, false));
        } else {
          link(tasks_of(d, v, mb, true), tasks_of(d, v, mb, false));  // the last stage's backward starts from its own loss
        }
      }
    }
  }
}

// Data-parallel gradient all-reduce (reduce-scatter with the distributed optimizer), one collective per bucket,
// on its own stream so that it overlaps the rest of the backward pass. Returns each GPU's reductions.
std::vector<std::vector<sim::TaskId>> MegatronBuilder::reduce_gradients() {
  std::vector<std::vector<sim::TaskId>> gpu_reductions(static_cast<std::size_t>(in_.cluster.gpus()));
  reduce_data_parallel(gpu_reductions);
  reduce_tied_embeddings(gpu_reductions);
  return gpu_reductions;
}

// Tied embeddings over several stages: the first stage's word embeddings and the last stage's copy (its LM head)
// are summed after the data-parallel reduction, each (replica, cp, TP) pair over its own group of two, as
// Megatron-LM's embedding group does (_allreduce_word_embedding_grads).
void MegatronBuilder::reduce_tied_embeddings(std::vector<std::vector<sim::TaskId>>& gpu_reductions) {
  if (!model_.tied_embeddings || p_.pp == 1) return;
  const auto bytes = static_cast<std::int64_t>(static_cast<double>(model_.vocab * h_) / p_.tp * in_.precision.grad_bytes);
  for (int d = 0; d < p_.dp; ++d) {
    for (int r = 0; r < stage_ranks_; ++r) {
      const sim::DeviceId first = gpu_of(0, d, r), last = gpu_of(p_.pp - 1, d, r);
      std::vector<sim::TaskId> deps;
      for (sim::DeviceId gpu : {first, last}) {
        deps.insert(deps.end(), gpu_reductions[gpu].begin(), gpu_reductions[gpu].end());
        if (last_compute_[gpu] >= 0) deps.push_back(last_compute_[gpu]);
      }
      const sim::TaskId reduce = g_.collective(
          "embedding all-reduce d" + std::to_string(d) + " r" + std::to_string(r),
          {sim::CollectiveOp::all_reduce, sim::Algorithm::ring, g_.add_group({first, last}), std::max<std::int64_t>(bytes, 2)}, deps, kDpStream);
      g_.set_op(reduce, sim::Op::gradients(0, -1, false, true));
      gpu_reductions[first].push_back(reduce);
      gpu_reductions[last].push_back(reduce);
    }
  }
}

void MegatronBuilder::reduce_data_parallel(std::vector<std::vector<sim::TaskId>>& gpu_reductions) {
  if (grad_ring_ <= 1) return;
  std::map<std::pair<int, int>, std::int32_t> groups;
  for (const auto& key : bucket_order_) {
    const Bucket& b = buckets_.at(key);
    auto [it, inserted] = groups.try_emplace({b.stage, b.t}, 0);
    if (inserted) it->second = g_.add_group(grad_group(b.stage, b.t));
    const auto bytes = static_cast<std::int64_t>(b.params * in_.precision.grad_bytes) / grad_ring_ * grad_ring_ + grad_ring_;
    const sim::TaskId reduce = g_.collective(std::string(p_.distributed_optimizer ? "DP reduce-scatter" : "DP all-reduce") + " stage " +
                                                 std::to_string(b.stage) + " tp" + std::to_string(b.t) + " bucket " +
                                                 std::to_string(std::get<2>(key)),
                                             {p_.distributed_optimizer ? sim::CollectiveOp::reduce_scatter : sim::CollectiveOp::all_reduce,
                                              sim::Algorithm::ring, it->second, bytes, ring_ranks_, ring_across_nodes_},
                                             b.ready, kDpStream);
    g_.set_op(reduce, sim::Op::gradients(static_cast<std::int32_t>(b.first_layer), static_cast<std::int32_t>(b.last_layer), b.head, b.embedding));
    for (sim::DeviceId gpu : grad_group(b.stage, b.t)) gpu_reductions[gpu].push_back(reduce);
  }
}

// The optimizer step on each GPU after its reductions; with the distributed optimizer every data-parallel rank
// then gets the others' updated weights.
void MegatronBuilder::optimizer_steps(const std::vector<std::vector<sim::TaskId>>& reductions) {
  const int shards = p_.distributed_optimizer ? grad_ring_ : 1;
  std::vector<sim::TaskId> step(static_cast<std::size_t>(in_.cluster.gpus()));
  for (int gpu = 0; gpu < in_.cluster.gpus(); ++gpu) {
    std::vector<sim::TaskId> deps = reductions[gpu];
    if (last_compute_[gpu] >= 0) deps.push_back(last_compute_[gpu]);
    step[gpu] = g_.add("optimizer step gpu" + std::to_string(gpu),
                       {gpu,
                        {sim::StreamKind::compute, 0},
                        false,
                        sim::OptimizerStep{static_cast<std::int64_t>(gpu_params_[gpu] * kAdamBytesPerParam / shards)},
                        sim::Op::optimizer_of(gpu)},
                       deps);
  }
  if (!p_.distributed_optimizer || grad_ring_ <= 1) return;
  for (int stage = 0; stage < p_.pp; ++stage) {
    for (int t = 0; t < tp_; ++t) {
      const std::vector<sim::DeviceId> members = grad_group(stage, t);
      std::vector<sim::TaskId> deps;
      for (sim::DeviceId gpu : members) deps.push_back(step[gpu]);
      const double weights = gpu_params_[members.front()] * in_.precision.weight_bytes;
      // Model states: the executors hold whole weights per rank, so their updated copies need no message.
      g_.set_op(g_.collective("DP all-gather weights stage " + std::to_string(stage) + " tp" + std::to_string(t),
                              {sim::CollectiveOp::all_gather, sim::Algorithm::ring, g_.add_group(members),
                               static_cast<std::int64_t>(weights) / grad_ring_ * grad_ring_ + grad_ring_, ring_ranks_, ring_across_nodes_},
                              deps, kDpStream),
                {sim::OpCode::states});
    }
  }
}

}  // namespace

sim::TaskGraph build_megatron(const StepInputs& in, const MegatronParams& p) {
  check_megatron(in, p);
  return MegatronBuilder(in, p).build();
}

}  // namespace trainyard::planner
