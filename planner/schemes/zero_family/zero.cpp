#include "planner/schemes/zero_family/zero.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "common/error.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/zero_family/closed_form.hpp"

namespace trainyard::planner {

namespace {

constexpr int kGatherStream = 1, kReduceStream = 2;  // comm 0: Ulysses all-to-alls

std::int64_t rounded(double bytes, std::int64_t group) {
  const auto b = std::max<std::int64_t>(1, static_cast<std::int64_t>(bytes));
  return (b + group - 1) / group * group;
}

}  // namespace

std::int64_t zero_micro_batches(const StepInputs& in, const ZeroParams& p) {
  const std::int64_t groups = in.cluster.gpus() / (p.sp * p.cp);
  return in.workload.global_batch / (groups * p.micro_batch);
}

void check_zero(const StepInputs& in, const ZeroParams& p) {
  const auto& m = in.model;
  const int gpus = in.cluster.gpus();
  auto fail = [](const std::string& flag, const std::string& expected, const std::string& got) { throw InputError(flag, "value", expected, got); };
  if (p.stage < 0 || p.stage > 3) fail("--zero-stage", "0, 1, 2 or 3", std::to_string(p.stage));
  if (p.sp < 1 || gpus % p.sp != 0) fail("--sp", "a divisor of the cluster's " + std::to_string(gpus) + " GPUs", std::to_string(p.sp));
  if (m.heads % p.sp != 0 || m.kv_heads % p.sp != 0) {
    fail("--sp", "a divisor of the heads (" + std::to_string(m.heads) + ") and kv heads (" + std::to_string(m.kv_heads) + ")", std::to_string(p.sp));
  }
  if (in.workload.seq_len % p.sp != 0) fail("--sp", "a divisor of the sequence length", std::to_string(p.sp));
  if (p.cp < 1 || gpus % p.cp != 0) fail("--cp", "a divisor of the cluster's " + std::to_string(gpus) + " GPUs", std::to_string(p.cp));
  if (p.cp > 1 && p.sp > 1) fail("--cp", "1 with --sp > 1 (Ulysses and ring attention are separate schemes here)", std::to_string(p.cp));
  if (in.workload.seq_len % (p.zigzag ? 2 * p.cp : p.cp) != 0) {
    fail("--cp", "a degree such that the sequence splits into " + std::string(p.zigzag ? "2 * cp" : "cp") + " equal chunks", std::to_string(p.cp));
  }
  if (p.zigzag && p.cp == 1) fail("--zigzag", "only with --cp > 1", "--cp 1");
  if (p.checkpoint_every < 1 || p.checkpoint_every > m.layers) {
    fail("--recompute", "activation checkpoints every 1 to " + std::to_string(m.layers) + " layers", std::to_string(p.checkpoint_every));
  }
  // A chunk of at least the whole sequence is one chunk (each GPU's share whole), as DeepSpeed's FPDT takes it.
  const bool one_chunk = p.fpdt_chunk >= in.workload.seq_len;
  if (p.fpdt_chunk < 0 || (p.fpdt_chunk > 0 && !one_chunk && (in.workload.seq_len % p.fpdt_chunk != 0 || p.fpdt_chunk % p.sp != 0))) {
    fail("--chunk", "a chunk (global tokens) dividing the sequence length and divisible by sp, or at least the sequence (one chunk)",
         std::to_string(p.fpdt_chunk));
  }
  if (p.fpdt_chunk > 0 && p.cp > 1) fail("--chunk", "no FPDT chunking with ring attention", std::to_string(p.fpdt_chunk));
  if (p.micro_batch < 1) fail("--micro-batch", "a positive integer", std::to_string(p.micro_batch));
  const std::int64_t groups = gpus / (p.sp * p.cp);
  if (in.workload.global_batch % (groups * p.micro_batch) != 0) {
    fail("--global-batch", "a multiple of (GPUs / (sp * cp)) * micro-batch = " + std::to_string(groups * p.micro_batch),
         std::to_string(in.workload.global_batch));
  }
  if (p.offload_params && p.stage != 3) fail("--offload", "params only with --zero-stage 3", "params");
  if (p.offload_grads && p.stage < 2) fail("--offload", "grads only with --zero-stage 2 or 3", "grads");
  if (p.offload_optimizer && p.stage < 1) fail("--offload", "optimizer only with --zero-stage 1 to 3", "optimizer");
}

ZeroStateBytes zero_state_bytes(const StepInputs& in, const ZeroParams& p) {
  const auto& m = in.model;
  const auto& pol = in.precision;
  const auto params = m.param_counts();
  const double n = p.whole_gpus(in.cluster.gpus()), all = m.params();
  const double resident = params.embedding + static_cast<double>(m.vocab * m.hidden) + params.final_norm;
  const double layers_params = params.per_layer() * static_cast<double>(m.layers);
  ZeroStateBytes s;
  s.weights = pol.weight_bytes * ((p.stage == 3 ? layers_params / n : layers_params) + resident);
  s.host_weights = p.offload_params ? pol.weight_bytes * layers_params / n : 0;
  s.grads = pol.grad_bytes * (p.stage >= 2 ? all / n : all);
  s.optimizer = (pol.master_bytes + pol.optimizer_bytes) * (p.stage >= 1 ? all / n : all);
  return s;
}

LayerSplit zero_layer_split(const StepInputs& in, const ZeroParams& p) {
  LayerSplit split{p.micro_batch, in.workload.seq_len, 1, false, false};
  split.ulysses = p.sp;
  split.cp = p.cp;
  split.zigzag = p.zigzag;
  split.fpdt_chunks = p.fpdt_chunk > 0 ? static_cast<int>(std::max<std::int64_t>(1, in.workload.seq_len / p.fpdt_chunk)) : 1;
  if (split.cp == 1 && split.fpdt_chunks == 1) split.score_bytes = stored_score_bytes(in.cluster);  // ring and FPDT attention are fused
  return split;
}

namespace {

// Builds one step of the ZeRO family (zero, Ulysses, ring attention, FPDT). Its state is the members; its phases
// the methods build() calls in order: the model states, then per micro-batch the forward pass (stage 3 gathers
// each layer's parameters one layer ahead; checkpointing trades a layer's activations for its input), the LM head
// and loss, the backward pass with each layer's gradient reduction, and last the optimizer step.
class ZeroBuilder {
 public:
  ZeroBuilder(const StepInputs& in, const ZeroParams& p);
  sim::TaskGraph build();

 private:
  void model_states();
  void forward_pass(const std::string& tag, std::vector<std::vector<sim::TaskId>>& saved);
  void checkpoint_layer(const std::string& prefix, std::int64_t l, std::vector<sim::TaskId>& saved);
  void loss(const std::string& tag);
  void backward_pass(const std::string& tag, bool last_mb, std::vector<std::vector<sim::TaskId>>& saved);
  void backward_layer(std::int64_t l, const std::string& tag, std::vector<sim::TaskId>& saved);
  void reduce_layer_gradients(const std::string& prefix, std::int64_t l, bool last_mb);
  void embeddings(const std::string& name, bool backward);
  // The stack's rotary tables at the whole sequence's length (StackProfile::rotary_tables), per GPU: those kept
  // through the micro-batch and those kept through its forward (empty where the stack has none).
  struct RotaryAllocs {
    std::vector<sim::TaskId> step, forward;
  };
  RotaryAllocs rotary_tables(const std::string& tag);
  void release(const std::vector<sim::TaskId>& allocs, const std::string& name);
  void optimizer_step();
  // Each group's layer emitter over the GPUs' chains (`last_`), its tasks at layer `l` of the group's sequence.
  void run_groups(std::int64_t l, const std::function<void(LayerEmitter&, std::vector<sim::TaskId>&)>& emit);
  // The step's sequence a GPU works on in the current micro-batch: each group of GPUs (one GPU without Ulysses
  // or CP) takes its own sequences, micro-batch after micro-batch. What the executors index the tokens by.
  int seq_of(int gpu) const { return static_cast<int>((gpu / (p_.sp * p_.cp)) * mbs_ * p_.micro_batch + mb_ * p_.micro_batch); }
  // Its chunk: the sequence's tokens a GPU holds, one chunk of the graph's chunk length. Ring attention: the GPU's
  // place in its cp group (zigzag: and that chunk's mirror, sim::Op::zigzag); else the whole sequence (Ulysses'
  // split is inside the op).
  sim::Op op_at(sim::OpCode code, std::int64_t layer, int gpu) const {
    return emitters_.front().on_rank(sim::Op(code, seq_of(gpu), static_cast<std::int32_t>(layer), 0),
                                     static_cast<std::size_t>(gpu % (p_.sp * p_.cp)));
  }
  std::vector<sim::TaskId> all_last() const;
  sim::TaskId gather_layer(const std::string& name, std::int64_t layer);
  void release_gather(std::size_t index, const std::string& name);
  void needs_gather(sim::TaskId gather, sim::TaskId begin);
  void copy_out_gathered(sim::TaskId gather, const std::string& name);
  void copy_in_grads(const std::string& name);
  bool reduces_after(bool last_mb) const;
  sim::TaskId reduce_gradients(const std::string& prefix, double params, const sim::Op& carries);
  void reduce_resident_gradients(const std::string& prefix, double params, bool last_mb, const sim::Op& carries);
  std::vector<sim::TaskId> fpdt_host_buffers(const std::string& name);
  void release_host_buffers(const std::vector<sim::TaskId>& ids, const std::string& name);
  sim::DeviceId host_of(int gpu) const { return sim::host_device(in_.cluster.node_of(gpu)); }

  const StepInputs& in_;
  const ZeroParams& p_;
  const model::ModelConfig& model_;
  const stacks::StackProfile::CheckpointOffload& offload_;  // how --offload acts copies run
  const model::PrecisionPolicy& pol_;
  const int gpus_;
  const double n_;  // GPUs of the whole step, as a divisor of sharded states
  // A ZeRO collective over every GPU of the step: the whole ring's when only some of them are built (symmetry:
  // ring_ranks set), its bytes a multiple of that ring.
  sim::Collective over_everyone(sim::CollectiveOp op, double bytes) const {
    const int ring = p_.whole_gpus(gpus_);
    return {op, sim::Algorithm::ring, zero_group_, rounded(bytes, ring), ring > gpus_ ? ring : 0};
  }
  const LayerSplit split_;
  ZeroLayerBytes layer_bytes_;  // what a layer allocates: activations, recomputed set, checkpoint, FPDT host buffers
  double layer_params_ = 0, all_params_ = 0;
  std::int64_t s_ = 0, h_ = 0;
  double copy_out_bytes_ = 0;          // the stack's copy of a gathered layer's parameters (FSDP2)
  double reduce_bytes_per_param_ = 0;  // the gradient reduction's dtype
  double copy_in_passes_ = 0;          // the stack's copy of a layer's gradients into the reduction's input

  sim::TaskGraph g_;
  std::int32_t zero_group_ = -1;
  std::vector<LayerEmitter> emitters_;
  std::vector<std::vector<sim::DeviceId>> group_ranks_;
  std::vector<sim::TaskId> last_;  // each GPU's latest compute task
  // Stage 3: the gathers issued so far, in order, and per gather and GPU the alloc and the free of its buffer.
  std::vector<sim::TaskId> gather_chain_;
  std::vector<std::vector<sim::TaskId>> gather_buffers_, gather_releases_;
  std::vector<sim::TaskId> reductions_;  // gradient reductions the optimizer waits for
  // The latest reduction of each gradient group (a layer; model_.layers: the LM head's; + 1: the embedding's). The
  // next micro-batch adds to those gradients in place, so its first task that may write them waits for it.
  std::map<std::int64_t, sim::TaskId> last_reduction_;
  void after_reduction(std::int64_t group, sim::TaskId first);
  std::int64_t mbs_ = 1, mb_ = 0;                                       // micro-batches per GPU, and the one being built
  std::map<std::pair<std::int64_t, int>, sim::TaskId> checkpoint_d2h_;  // (layer, GPU): the copy of its offloaded checkpoint
};

}  // namespace

ZeroLayerBytes zero_layer_bytes(const StepInputs& in, const ZeroParams& p) {
  const model::ModelConfig& m = in.model;
  const LayerSplit split = zero_layer_split(in, p);
  ZeroLayerBytes b;
  b.forward = split.fpdt_chunks > 1 ? fpdt_working_bytes(m, split) : layer_activation_bytes(m, split, Recompute::none).total();
  b.recomputed = b.forward;
  b.checkpoint = layer_activation_bytes(m, split, Recompute::full).total();
  if (split.fpdt_chunks <= 1) return b;
  // The tensors of the GPU's whole share the stack's FPDT holds at once.
  const auto& whole = in.cluster.stack.fpdt_full_length;
  const double tensor = 2.0 * static_cast<double>(split.local_tokens() * m.hidden);  // bf16
  b.forward = std::max(b.forward, whole.forward_tensors.value * tensor);
  b.recomputed = std::max(b.recomputed, whole.backward_tensors.value * tensor);
  b.fpdt_host = static_cast<double>(split.local_tokens()) *
                (2.0 * static_cast<double>(2 * m.q_dim() + 2 * m.kv_dim()) + 4.0 * static_cast<double>(m.q_dim()));
  return b;
}

LossMemory zero_loss_memory(const StepInputs& in, const ZeroParams& p) {
  LossMemory memory = loss_memory(in.cluster.stack);
  const LayerSplit split = zero_layer_split(in, p);
  if (split.fpdt_chunks > 1) memory.chunk_tokens = std::max<std::int64_t>(1, split.local_tokens() / split.fpdt_chunks);
  return memory;
}

namespace {

ZeroBuilder::ZeroBuilder(const StepInputs& in, const ZeroParams& p)
    : in_(in),
      p_(p),
      model_(in.model),
      offload_(in.cluster.stack.checkpoint_offload),
      pol_(in.precision),
      gpus_(in.cluster.gpus()),
      n_(p.whole_gpus(in.cluster.gpus())),
      split_(zero_layer_split(in, p)),
      last_(static_cast<std::size_t>(in.cluster.gpus()), -1) {
  layer_bytes_ = zero_layer_bytes(in, p);
  layer_params_ = model_.param_counts().per_layer();
  all_params_ = model_.params();
  s_ = split_.local_tokens();
  h_ = model_.hidden;
  const stacks::StackProfile& stack = in.cluster.stack;
  copy_out_bytes_ = stack.gathered_params_copy_passes.value * pol_.weight_bytes * layer_params_;
  reduce_bytes_per_param_ = stack.gradient_reduce_bytes.value > 0 ? stack.gradient_reduce_bytes.value : pol_.grad_bytes;
  copy_in_passes_ = stack.reduced_grads_copy_passes.value;
}

sim::TaskGraph ZeroBuilder::build() {
  g_.reserve(static_cast<std::size_t>(zero_tasks(in_, p_)));
  std::vector<sim::DeviceId> everyone;
  for (int gpu = 0; gpu < gpus_; ++gpu) everyone.push_back(gpu);
  zero_group_ = gpus_ > 1 ? g_.add_group(everyone) : -1;
  model_states();
  const int group_size = p_.sp * p_.cp;
  for (int grp = 0; grp < gpus_ / group_size; ++grp) {
    std::vector<sim::DeviceId> ranks;
    for (int r = 0; r < group_size; ++r) ranks.push_back(grp * group_size + r);
    group_ranks_.push_back(ranks);
    emitters_.emplace_back(g_, model_, split_, ranks);
  }
  const std::int64_t mbs = zero_micro_batches(in_, p_);
  mbs_ = mbs;
  g_.set_chunk_tokens(split_.chunk_tokens());  // one chunk per sequence, a rank's share of it; zigzag: two, each half of it
  g_.set_sequence_tokens(in_.workload.seq_len);
  const model::ParamCounts counts = model_.param_counts();
  // What each reduction carries, for the executors (sim::Op::gradients).
  const sim::Op head = sim::Op::gradients(0, -1, true, false), embedding = sim::Op::gradients(0, -1, false, true);
  for (std::int64_t mb = 0; mb < mbs; ++mb) {
    mb_ = mb;
    const std::string tag = "mb" + std::to_string(mb);
    std::vector<std::vector<sim::TaskId>> saved(static_cast<std::size_t>(model_.layers));  // per layer, per GPU
    const RotaryAllocs rotary = rotary_tables(tag);
    embeddings("F " + tag + " embedding", false);
    forward_pass(tag, saved);
    release(rotary.forward, tag + " fp32 rotary tables");
    const auto loss_begin = static_cast<sim::TaskId>(g_.size());
    loss(tag);
    after_reduction(model_.layers, loss_begin);
    if (model_.tied_embeddings) after_reduction(model_.layers + 1, loss_begin);  // the LM head adds to the embedding's
    reduce_resident_gradients("B " + tag + " head", counts.lm_head + counts.final_norm, mb == mbs - 1, head);
    backward_pass(tag, mb == mbs - 1, saved);
    const auto embedding_begin = static_cast<sim::TaskId>(g_.size());
    embeddings("B " + tag + " embedding", true);
    after_reduction(model_.layers + 1, embedding_begin);
    reduce_resident_gradients("B " + tag + " embedding", counts.embedding, mb == mbs - 1, embedding);
    release(rotary.step, tag + " rotary tables");
  }
  optimizer_step();
  return std::move(g_);
}

// Model states. The embedding and LM head stay whole on every GPU (not sharded by stage 3); the layers' weights,
// gradients and optimizer states are sharded by stage and may live in host DRAM.
void ZeroBuilder::model_states() {
  const ZeroStateBytes states = zero_state_bytes(in_, p_);
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    const sim::DeviceId host = host_of(gpu);
    g_.alloc("weights gpu" + std::to_string(gpu), gpu, sim::Pool::hbm, rounded(states.weights - states.host_weights, 1), "weights");
    if (states.host_weights > 0) {
      g_.alloc("host weights gpu" + std::to_string(gpu), host, sim::Pool::dram, rounded(states.host_weights, 1), "offloaded weights");
    }
    g_.alloc("grads gpu" + std::to_string(gpu), p_.offload_grads ? host : gpu, p_.offload_grads ? sim::Pool::dram : sim::Pool::hbm,
             rounded(states.grads, 1), "gradients");
    g_.alloc("optimizer gpu" + std::to_string(gpu), p_.offload_optimizer ? host : gpu, p_.offload_optimizer ? sim::Pool::dram : sim::Pool::hbm,
             rounded(states.optimizer, 1), "master weights and Adam moments");
  }
}

void ZeroBuilder::run_groups(std::int64_t l, const std::function<void(LayerEmitter&, std::vector<sim::TaskId>&)>& emit) {
  for (std::size_t grp = 0; grp < emitters_.size(); ++grp) {
    std::vector<sim::TaskId> chain;
    for (auto r : group_ranks_[grp]) chain.push_back(last_[r]);
    emitters_[grp].set_coordinates(seq_of(group_ranks_[grp].front()), static_cast<int>(l), 0);
    emit(emitters_[grp], chain);
    for (std::size_t i = 0; i < chain.size(); ++i) last_[group_ranks_[grp][i]] = chain[i];
  }
}

std::vector<sim::TaskId> ZeroBuilder::all_last() const {
  std::vector<sim::TaskId> deps;
  for (auto id : last_) {
    if (id >= 0) deps.push_back(id);
  }
  return deps;
}

ZeroBuilder::RotaryAllocs ZeroBuilder::rotary_tables(const std::string& tag) {
  const auto& tables = in_.cluster.stack.rotary_tables;
  const double elements = static_cast<double>(in_.workload.seq_len * model_.head_dim);  // per table, of the whole sequence
  RotaryAllocs out;
  const auto alloc_each = [&](double bytes, const std::string& what, std::vector<sim::TaskId>& ids) {
    if (bytes <= 0) return;
    for (int gpu = 0; gpu < gpus_; ++gpu) {
      std::vector<sim::TaskId> deps;
      if (last_[gpu] >= 0) deps.push_back(last_[gpu]);
      ids.push_back(g_.alloc(tag + " " + what, gpu, sim::Pool::hbm, rounded(bytes, 1), what, deps));
      last_[gpu] = ids.back();
    }
  };
  alloc_each(tables.step_bytes_per_token_dim.value * elements, "rotary tables (bf16)", out.step);
  alloc_each(tables.forward_bytes_per_token_dim.value * elements, "rotary tables (fp32)", out.forward);
  return out;
}

void ZeroBuilder::release(const std::vector<sim::TaskId>& allocs, const std::string& name) {
  for (std::size_t gpu = 0; gpu < allocs.size(); ++gpu) g_.free(name + " release", allocs[gpu], std::vector<sim::TaskId>{last_[gpu]});
}

void ZeroBuilder::embeddings(const std::string& name, bool backward) {
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    auto& at = last_[gpu];
    at = emit_embedding(g_, gpu, name, s_, h_, backward, at, op_at(sim::OpCode::none, 0, gpu));
  }
}

// Stage 3: the parameters of a layer are gathered into a whole-layer buffer on every GPU, one layer ahead of the
// compute that needs them (the buffer for layer l is allocated once layer l - 2's is released).
sim::TaskId ZeroBuilder::gather_layer(const std::string& name, std::int64_t layer) {
  if (p_.stage != 3 || gpus_ == 1) return -1;
  std::vector<sim::TaskId> deps;
  if (!gather_chain_.empty()) deps.push_back(gather_chain_.back());
  std::vector<sim::TaskId> buffers;
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    // At most two layer buffers: this one waits until the buffer of two gathers ago is released.
    std::vector<sim::TaskId> after;
    const std::size_t k = gather_chain_.size();
    if (k >= 2 && gather_releases_[k - 2][gpu] >= 0) after.push_back(gather_releases_[k - 2][gpu]);
    buffers.push_back(
        g_.alloc(name + " buffer", gpu, sim::Pool::hbm, rounded(pol_.weight_bytes * layer_params_, 1), "gathered layer parameters", after));
    deps.push_back(buffers.back());
    if (p_.offload_params) {
      deps.push_back(
          g_.set_op(g_.copy(name + " H2D shard", gpu, {sim::Copy::Direction::h2d, rounded(pol_.weight_bytes * layer_params_ / n_, 1), true},
                            std::vector<sim::TaskId>{buffers.back()}),
                    sim::Op::layer_weights(static_cast<std::int32_t>(layer))));
    }
  }
  const sim::TaskId gather = g_.set_op(
      g_.collective(name, over_everyone(sim::CollectiveOp::all_gather, pol_.weight_bytes * layer_params_), deps, kGatherStream),
      {sim::OpCode::states});
  gather_chain_.push_back(gather);
  gather_buffers_.push_back(buffers);
  gather_releases_.emplace_back(static_cast<std::size_t>(gpus_), -1);
  return gather;
}

void ZeroBuilder::release_gather(std::size_t index, const std::string& name) {
  if (index >= gather_buffers_.size()) return;
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    gather_releases_[index][gpu] = g_.free(name + " release", gather_buffers_[index][gpu], std::vector<sim::TaskId>{last_[gpu]});
  }
}

// A layer's compute waits for its gathered parameters: attach the gather to each GPU's first task of the layer
// (emitted from `begin` on).
void ZeroBuilder::needs_gather(sim::TaskId gather, sim::TaskId begin) {
  if (gather < 0) return;
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    for (sim::TaskId id = begin; id < static_cast<sim::TaskId>(g_.size()); ++id) {
      const auto& task = g_.task(id);
      if (task.device == gpu && task.kind() != sim::TaskKind::collective && task.kind() != sim::TaskKind::alloc) {
        g_.add_dependency(gather, id);
        break;
      }
    }
  }
}

// The stack's copy of a gathered layer's parameters out of the all-gather buffer (FSDP2), on each GPU's compute
// stream once the gather has landed.
void ZeroBuilder::copy_out_gathered(sim::TaskId gather, const std::string& name) {
  if (gather < 0 || copy_out_bytes_ <= 0) return;
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    auto& at = last_[gpu];
    std::vector<sim::TaskId> deps{gather};
    if (at >= 0) deps.push_back(at);
    at = g_.set_op(g_.elementwise(name + " copy out gathered params", gpu, {rounded(copy_out_bytes_, 1), rounded(copy_out_bytes_, 1)}, deps),
                   {sim::OpCode::states});
  }
}

// The stack's copy of a layer's gradients into the reduction's input buffer (FSDP2's copy-in with the cast to
// reduce_dtype), on each GPU's compute stream before the reduction.
void ZeroBuilder::copy_in_grads(const std::string& name) {
  if (copy_in_passes_ <= 0) return;
  const double read = copy_in_passes_ * pol_.grad_bytes * layer_params_, written = copy_in_passes_ * reduce_bytes_per_param_ * layer_params_;
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    auto& at = last_[gpu];
    at = g_.set_op(g_.elementwise(name + " copy in grads", gpu, {rounded(read, 1), rounded(written, 1)},
                                  at >= 0 ? std::vector<sim::TaskId>{at} : std::vector<sim::TaskId>{}),
                   {sim::OpCode::states});
  }
}

// FPDT keeps a layer's attention tensors (q, k, v, o, lse, and in backward dO, dq) in host DRAM while the layer runs.
std::vector<sim::TaskId> ZeroBuilder::fpdt_host_buffers(const std::string& name) {
  std::vector<sim::TaskId> ids;
  if (layer_bytes_.fpdt_host <= 0) return ids;
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    std::vector<sim::TaskId> after;
    if (last_[gpu] >= 0) after.push_back(last_[gpu]);
    ids.push_back(g_.alloc(name + " FPDT host buffers", host_of(gpu), sim::Pool::dram, rounded(layer_bytes_.fpdt_host, 1),
                           "FPDT attention tensors " + name, after));
  }
  return ids;
}

void ZeroBuilder::release_host_buffers(const std::vector<sim::TaskId>& ids, const std::string& name) {
  for (std::size_t gpu = 0; gpu < ids.size(); ++gpu) {
    // Released once the layer's compute and the copies that read or write them are done: the copies are the last
    // tasks on the GPU's copy engines, so wait for the GPU's chain and every copy of this layer.
    std::vector<sim::TaskId> deps{last_[gpu]};
    for (sim::TaskId id = ids.back() + 1; id < static_cast<sim::TaskId>(g_.size()); ++id) {
      if (g_.task(id).kind() == sim::TaskKind::copy && g_.task(id).device == static_cast<sim::DeviceId>(gpu)) deps.push_back(id);
    }
    g_.free(name + " release FPDT host buffers", ids[gpu], deps);
  }
}

void ZeroBuilder::forward_pass(const std::string& tag, std::vector<std::vector<sim::TaskId>>& saved) {
  for (std::int64_t l = 0; l < model_.layers; ++l) {
    const std::string prefix = "F L" + std::to_string(l) + " " + tag;
    const std::size_t gather_index = gather_chain_.size();
    const sim::TaskId gather = gather_layer(prefix + " gather params", l);
    for (int gpu = 0; gpu < gpus_; ++gpu) {
      std::vector<sim::TaskId> deps;
      if (last_[gpu] >= 0) deps.push_back(last_[gpu]);
      // Every layer's forward holds its full activations; with checkpointing only until the layer ends.
      saved[l].push_back(g_.alloc(prefix + " activations", gpu, sim::Pool::hbm, rounded(layer_bytes_.forward, 1), "activations " + prefix, deps));
      last_[gpu] = saved[l].back();
    }
    const std::vector<sim::TaskId> host_buffers = fpdt_host_buffers(prefix);
    const auto begin = static_cast<sim::TaskId>(g_.size());
    copy_out_gathered(gather, prefix);
    run_groups(l, [&](LayerEmitter& layer, std::vector<sim::TaskId>& chain) { layer.forward(prefix, chain); });
    needs_gather(gather, begin);
    release_host_buffers(host_buffers, prefix);
    release_gather(gather_index, prefix);
    if (p_.checkpoints_layer(l)) checkpoint_layer(prefix, l, saved[l]);
  }
}

// Keep only the layer input: the rest of this layer's activations are dropped (AC); with OC the input goes to
// host DRAM as well. `saved` (per GPU) then holds the checkpoint's allocation.
void ZeroBuilder::checkpoint_layer(const std::string& prefix, std::int64_t l, std::vector<sim::TaskId>& saved) {
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    const sim::TaskId alloc = saved[gpu];
    const sim::TaskId done = last_[gpu];
    // Trade the full activations for the checkpoint (the layer input): free them, keep a checkpoint-sized
    // allocation; with OC the checkpoint is copied to host DRAM and released on the GPU once copied.
    const sim::TaskId keep = g_.alloc(prefix + " checkpoint", gpu, sim::Pool::hbm, rounded(layer_bytes_.checkpoint, 1), "checkpoint " + prefix,
                                      std::vector<sim::TaskId>{done});
    // The next layer starts once this one's activations are traded for the checkpoint (PyTorch frees them as the
    // checkpointed forward returns), so that its allocations never overlap them.
    const sim::TaskId drop = g_.free(prefix + " drop activations", alloc, std::vector<sim::TaskId>{keep});
    last_[gpu] = drop;
    if (!p_.offload_activations) {
      saved[gpu] = keep;
      continue;
    }
    const sim::TaskId host_copy = g_.alloc(prefix + " host checkpoint", host_of(gpu), sim::Pool::dram, rounded(layer_bytes_.checkpoint, 1),
                                           "offloaded checkpoint " + prefix, std::vector<sim::TaskId>{keep});
    const sim::TaskId d2h = g_.set_op(
        g_.copy(prefix + " D2H checkpoint", gpu, {sim::Copy::Direction::d2h, rounded(layer_bytes_.checkpoint, 1), offload_.pinned},
                std::vector<sim::TaskId>{host_copy, drop}),
        op_at(sim::OpCode::input, l, gpu));
    if (offload_.blocking) last_[gpu] = d2h;  // the next layer waits for the copy
    checkpoint_d2h_[{l, gpu}] = d2h;          // the backward's copy back reads what it wrote
    g_.free(prefix + " release checkpoint", keep, std::vector<sim::TaskId>{d2h});
    saved[gpu] = host_copy;
  }
}

// LM head and loss, forward and backward fused per chunk. FPDT computes the loss in its sequence chunks
// (DeepSpeed's FPDT_LogitsLoss); the others as the stack does.
void ZeroBuilder::loss(const std::string& tag) {
  const LossMemory memory = zero_loss_memory(in_, p_);
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    auto& at = last_[gpu];
    at = emit_loss(g_, gpu, tag, s_, h_, model_.vocab, at, op_at(sim::OpCode::none, model_.layers, gpu), memory);
  }
}

// Backward, last layer first; each layer's gradients reduced as soon as they exist.
void ZeroBuilder::backward_pass(const std::string& tag, bool last_mb, std::vector<std::vector<sim::TaskId>>& saved) {
  for (std::int64_t l = model_.layers - 1; l >= 0; --l) {
    backward_layer(l, tag, saved[l]);
    reduce_layer_gradients("B L" + std::to_string(l) + " " + tag, l, last_mb);
  }
}

void ZeroBuilder::backward_layer(std::int64_t l, const std::string& tag, std::vector<sim::TaskId>& saved) {
  const std::string prefix = "B L" + std::to_string(l) + " " + tag;
  const std::size_t gather_index = gather_chain_.size();
  const sim::TaskId gather = gather_layer(prefix + " gather params", l);
  std::vector<sim::TaskId> transient(static_cast<std::size_t>(gpus_), -1);
  const bool checkpoint = p_.checkpoints_layer(l);
  for (int gpu = 0; gpu < gpus_ && checkpoint; ++gpu) {
    auto& at = last_[gpu];
    if (p_.offload_activations) {
      at = g_.set_op(g_.copy(prefix + " H2D checkpoint", gpu, {sim::Copy::Direction::h2d, rounded(layer_bytes_.checkpoint, 1), offload_.pinned},
                             std::vector<sim::TaskId>{at, checkpoint_d2h_.at({l, gpu})}),
                     op_at(sim::OpCode::input, l, gpu));
    }
    // The recomputed layer's activations exist only while its backward runs.
    transient[gpu] = g_.alloc(prefix + " recomputed activations", gpu, sim::Pool::hbm, rounded(layer_bytes_.recomputed, 1), "recomputed " + prefix,
                              std::vector<sim::TaskId>{at});
    at = transient[gpu];
  }
  const std::vector<sim::TaskId> host_buffers = fpdt_host_buffers(prefix);
  const auto begin = static_cast<sim::TaskId>(g_.size());
  copy_out_gathered(gather, prefix);
  run_groups(l, [&](LayerEmitter& layer, std::vector<sim::TaskId>& chain) {
    if (checkpoint) layer.forward("R L" + std::to_string(l) + " " + tag, chain, true);
    layer.backward(prefix, chain);
  });
  after_reduction(l, begin);
  needs_gather(gather, begin);
  release_host_buffers(host_buffers, prefix);
  // The next layer's backward starts once this one's activations are freed (no overlap of the two).
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    const sim::TaskId done = last_[gpu];
    if (transient[gpu] >= 0) g_.free(prefix + " free recomputed", transient[gpu], std::vector<sim::TaskId>{done});
    last_[gpu] = g_.free(prefix + " free saved", saved[gpu], std::vector<sim::TaskId>{done});
  }
  release_gather(gather_index, prefix);
}

// Gradients are reduced every micro-batch (stages 2-3) or once, after the last (0-1): reduce-scattered where the
// optimizer states are sharded (stages 1-3: each GPU steps its shard, as ZeRO's Pos moves the data-parallel volume,
// Rajbhandari et al. 2020 section 7, and DeepSpeed's stage 1 and Megatron's distributed optimizer run), all-reduced
// at stage 0.
bool ZeroBuilder::reduces_after(bool last_mb) const { return gpus_ > 1 && (p_.stage >= 2 || last_mb); }

// The reduction of `params` parameters' gradients over every GPU, once each GPU's work so far is done.
sim::TaskId ZeroBuilder::reduce_gradients(const std::string& prefix, double params, const sim::Op& carries) {
  const auto op = p_.stage >= 1 ? sim::CollectiveOp::reduce_scatter : sim::CollectiveOp::all_reduce;
  const sim::TaskId reduce = g_.set_op(g_.collective(prefix + (p_.stage >= 1 ? " reduce-scatter grads" : " all-reduce grads"),
                                                     over_everyone(op, reduce_bytes_per_param_ * params), all_last(), kReduceStream),
                                       carries);
  reductions_.push_back(reduce);
  // Where the stack does not overlap this stage's reductions (DeepSpeed's overlap_comm off), they run on the
  // compute stream: every GPU's next kernel waits for the reduction.
  if (!in_.cluster.stack.zero_overlap_comm.overlaps(p_.stage)) std::fill(last_.begin(), last_.end(), reduce);
  for (std::int32_t l = carries.kv_first; l <= carries.kv_last; ++l) last_reduction_[l] = reduce;
  if (carries.carries_head_gradients()) last_reduction_[model_.layers] = reduce;
  if (carries.carries_embedding_gradients()) last_reduction_[model_.layers + 1] = reduce;
  return reduce;
}

// On each GPU, the first compute task since `first` waits for the group's last reduction; the GPU's compute chain
// orders the rest after it.
void ZeroBuilder::after_reduction(std::int64_t group, sim::TaskId first) {
  const auto it = last_reduction_.find(group);
  if (it == last_reduction_.end()) return;
  std::set<sim::DeviceId> waiting;
  for (auto id = first; id < static_cast<sim::TaskId>(g_.size()); ++id) {
    const sim::Task& t = g_.task(id);
    if (t.stream.kind == sim::StreamKind::compute && waiting.insert(t.device).second) g_.add_dependency(it->second, id);
  }
}

// A layer's gradients (copied into the reduction's dtype first where the stack does so).
void ZeroBuilder::reduce_layer_gradients(const std::string& prefix, std::int64_t l, bool last_mb) {
  if (!reduces_after(last_mb)) return;
  copy_in_grads(prefix);
  const auto layer = static_cast<std::int32_t>(l);
  const sim::TaskId reduce = reduce_gradients(prefix, layer_params_, sim::Op::gradients(layer, layer, false, false));
  if (!p_.offload_grads || !last_mb) return;
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    reductions_.push_back(
        g_.set_op(g_.copy(prefix + " D2H grads", gpu, {sim::Copy::Direction::d2h, rounded(pol_.grad_bytes * layer_params_ / n_, 1), true},
                          std::vector<sim::TaskId>{reduce}),
                  sim::Op::gradients(layer, layer, false, false)));
  }
}

// The LM head's (with the final norm's) and the embedding's gradients, reduced as a layer's are: the head's once the
// loss's backward has made them, the embedding's after its backward (a tied head's part is in the embedding's).
void ZeroBuilder::reduce_resident_gradients(const std::string& prefix, double params, bool last_mb, const sim::Op& carries) {
  if (reduces_after(last_mb) && params > 0) reduce_gradients(prefix, params, carries);
}

// Optimizer step over each GPU's shard (all of it at stage 0), on the GPU or on its node's host, then the updated
// parameters go back to where the next step reads them.
void ZeroBuilder::optimizer_step() {
  const double shard = p_.stage >= 1 ? all_params_ / n_ : all_params_;
  std::vector<sim::TaskId> updated;
  for (int gpu = 0; gpu < gpus_; ++gpu) {
    std::vector<sim::TaskId> deps = reductions_;
    if (last_[gpu] >= 0) deps.push_back(last_[gpu]);
    const auto bytes = rounded(shard * kAdamBytesPerParam, 1);
    if (!p_.offload_optimizer) {
      updated.push_back(
          g_.set_op(g_.add("optimizer step gpu" + std::to_string(gpu), {gpu, {sim::StreamKind::compute, 0}, false, sim::OptimizerStep{bytes}}, deps),
                    sim::Op::optimizer_of(gpu)));
      continue;
    }
    const sim::TaskId step = g_.set_op(g_.add("optimizer step host for gpu" + std::to_string(gpu),
                                              {host_of(gpu), {sim::StreamKind::host, 0}, false, sim::OptimizerStep{bytes}}, deps),
                                       sim::Op::optimizer_of(gpu));
    // With the layers' parameters offloaded (ZeRO-Infinity) only the resident ones (embedding, LM head, final norm)
    // come back; the layers' are copied in from the host when next gathered.
    const double back = p_.offload_params ? (all_params_ - layer_params_ * static_cast<double>(model_.layers)) / n_ : shard;
    updated.push_back(g_.set_op(g_.copy("H2D updated params gpu" + std::to_string(gpu), gpu,
                                        {sim::Copy::Direction::h2d, rounded(pol_.weight_bytes * back, 1), true}, std::vector<sim::TaskId>{step}),
                                sim::Op::updated_weights_of(gpu)));
  }
  if (gpus_ > 1 && (p_.stage == 1 || p_.stage == 2)) {
    g_.set_op(g_.collective("all-gather updated params", over_everyone(sim::CollectiveOp::all_gather, pol_.weight_bytes * all_params_), updated,
                            kGatherStream),
              {sim::OpCode::states});
  }
}

}  // namespace

sim::TaskGraph build_zero(const StepInputs& in, const ZeroParams& p) {
  check_zero(in, p);
  return ZeroBuilder(in, p).build();
}

}  // namespace trainyard::planner
