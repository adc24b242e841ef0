#include "planner/megatron.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>

#include "common/error.hpp"

namespace trainyard::planner {

namespace {

constexpr int kPipeStream = 1, kDpStream = 2;  // comm 0: the TP collectives (LayerEmitter)

std::string mb_name(std::int64_t mb) { return "mb" + std::to_string(mb); }

}  // namespace

std::int64_t megatron_micro_batches(const StepInputs& in, const MegatronParams& p) {
  return in.workload.global_batch / (p.dp * p.micro_batch);
}

LayerSplit megatron_layer_split(const StepInputs& in, const MegatronParams& p) {
  LayerSplit split{p.micro_batch, in.workload.seq_len, p.tp, p.sequence_parallel, false};
  split.tp_comm_overlap = p.tp_comm_overlap;
  split.cp = p.whole_cp();
  if (p.cp_represented > 0) split.cp_ranks = p.cp;
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
  for (int s = 0; s < p.pp; ++s) out[static_cast<std::size_t>(s)] = each;
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
    const std::int64_t on_stage = stage_layers[static_cast<std::size_t>(v % p.pp)];
    const int chunk = v / p.pp;
    first.push_back(first.back() + on_stage / p.vpp + (chunk < on_stage % p.vpp ? 1 : 0));
  }
  return first;
}

namespace {
void check_megatron_stages(const model::ModelConfig& m, const MegatronParams& p) {
  auto fail = [](const std::string& flag, const std::string& expected, const std::string& got) {
    throw InputError(flag, "value", expected, got);
  };
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
  auto fail = [](const std::string& flag, const std::string& expected, const std::string& got) {
    throw InputError(flag, "value", expected, got);
  };
  if (p.tp < 1 || p.pp < 1 || p.dp < 1 || p.cp < 1 || p.vpp < 1 || p.micro_batch < 1) {
    fail("--tp/--pp/--dp/--cp/--vpp/--micro-batch", "positive integers", "a value below 1");
  }
  if (static_cast<std::int64_t>(p.tp) * p.pp * p.dp * p.cp != gpus) {
    fail("--tp/--pp/--dp/--cp", "tp * pp * dp * cp = the cluster's " + std::to_string(gpus) + " GPUs",
         std::to_string(p.tp) + " * " + std::to_string(p.pp) + " * " + std::to_string(p.dp) + " * " + std::to_string(p.cp) +
             " = " + std::to_string(static_cast<std::int64_t>(p.tp) * p.pp * p.dp * p.cp));
  }
  if (p.whole_cp() > 1 && in.workload.seq_len % (2 * p.whole_cp()) != 0) {
    fail("--cp", "a degree whose 2 * cp chunks divide the sequence (" + std::to_string(in.workload.seq_len) + " tokens)",
         std::to_string(p.whole_cp()));
  }
  if (p.cp_comm != CpComm::p2p && p.cp == 1) fail("--cp-comm", "p2p unless --cp > 1", std::string(to_string(p.cp_comm)));
  if (p.cp_comm == CpComm::a2a_p2p && (p.cp_a2a < 2 || p.cp_a2a >= p.cp || p.cp % p.cp_a2a != 0)) {
    fail("--cp-a2a", "with --cp-comm a2a+p2p, an all-to-all group size of at least 2 that divides --cp (" + std::to_string(p.cp) +
                         ") into at least 2 groups",
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
      fail(flag, "with --cp-comm " + std::string(to_string(p.cp_comm)) + ", an all-to-all size dividing each TP rank's heads (" +
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
    fail("--tp", "a divisor or a multiple of the GPUs per node (" + std::to_string(per_node) +
                     "): a tensor-parallel group stays inside a node or spans whole nodes", std::to_string(p.tp));
  }
  if (m.heads % p.tp != 0) fail("--tp", "a divisor of the model's heads (" + std::to_string(m.heads) + ")", std::to_string(p.tp));
  if (m.ffn_hidden % p.tp != 0) fail("--tp", "a divisor of ffn_hidden (" + std::to_string(m.ffn_hidden) + ")", std::to_string(p.tp));
  if (p.first_stage_layers == 0 && p.last_stage_layers == 0 && m.layers % (p.pp * p.vpp) != 0) {
    fail("--pp/--vpp", "pp * vpp dividing the model's " + std::to_string(m.layers) +
                           " layers (or an uneven split: --first-stage-layers, --last-stage-layers)",
         std::to_string(p.pp) + " * " + std::to_string(p.vpp));
  }
  check_megatron_stages(m, p);
  if (p.vpp > 1 && p.pp == 1) fail("--vpp", "1 unless --pp > 1 (interleaving needs a pipeline)", std::to_string(p.vpp));
  if (p.sequence_parallel && p.tp == 1) fail("--sequence-parallel", "only with --tp > 1", "--tp 1");
  if (p.tp_comm_overlap && !p.sequence_parallel) fail("--tp-comm-overlap", "only with --sequence-parallel (as Megatron requires)", "no --sequence-parallel");
  if (p.offload_activations && p.recompute != Recompute::full) {
    fail("--offload", "acts only with --recompute full (the offloaded checkpoints are the layer inputs)", "acts");
  }
  if (in.workload.global_batch % (p.dp * p.micro_batch) != 0) {
    fail("--global-batch", "a multiple of dp * micro-batch (" + std::to_string(p.dp * p.micro_batch) + ")",
         std::to_string(in.workload.global_batch));
  }
  const std::int64_t mbs = megatron_micro_batches(in, p);
  if (p.vpp > 1 && mbs % p.pp != 0) {
    fail("--vpp", "micro-batches per step (" + std::to_string(mbs) + ") a multiple of pp for the interleaved schedule",
         std::to_string(p.vpp));
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

sim::TaskGraph build_megatron(const StepInputs& in, const MegatronParams& p) {
  check_megatron(in, p);
  const auto& model = in.model;
  const auto& offload = in.cluster.stack.checkpoint_offload;  // how --offload acts copies run
  const std::int64_t mbs = megatron_micro_batches(in, p);
  const int virtual_stages = p.pp * p.vpp;
  // Virtual stage v (chunk v / pp of stage v % pp) holds layers [first_layer[v], first_layer[v + 1]).
  const std::vector<std::int64_t> stage_layers = megatron_stage_layers(model.layers, p);
  const std::vector<std::int64_t> first_layer = megatron_chunk_first_layers(model.layers, p);
  auto chunk_layers = [&](int v) { return first_layer[static_cast<std::size_t>(v) + 1] - first_layer[static_cast<std::size_t>(v)]; };
  const LayerSplit split = megatron_layer_split(in, p);
  const double act_per_layer = layer_activation_bytes(model, split, p.recompute).total();
  const double full_layer = layer_activation_bytes(model, split, Recompute::none).total();
  const bool full_recompute = p.recompute == Recompute::full;

  const auto params = model.param_counts();
  const double layer_params = params.per_layer() / p.tp;
  const std::int64_t s = split.local_tokens();  // one rank's tokens of the micro-batch (1/cp of them)
  const std::int64_t h = model.hidden;
  const std::int64_t vocab_shard = (model.vocab + p.tp - 1) / p.tp;

  sim::TaskGraph g;
  // Under full recompute a layer's whole activations exist only while its forward or backward runs.
  auto transient = [&](const std::vector<sim::DeviceId>& ranks, const std::string& name, std::vector<sim::TaskId>& last) {
    std::vector<sim::TaskId> ids;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      std::vector<sim::TaskId> after;
      if (last[r] >= 0) after.push_back(last[r]);
      ids.push_back(g.alloc(name + " working activations", ranks[r], sim::Pool::hbm,
                            std::max<std::int64_t>(1, static_cast<std::int64_t>(full_layer)), "working activations " + name, after));
      last[r] = ids.back();
    }
    return ids;
  };
  // Rank r of a replica's stage is cp index r / tp, TP index r % tp.
  const int stage_ranks = p.cp * p.tp;
  auto gpu_of = [&](int stage, int d, int r) { return (stage * p.dp + d) * stage_ranks + r; };
  auto ranks_of = [&](int stage, int d) {
    std::vector<sim::DeviceId> r;
    for (int i = 0; i < stage_ranks; ++i) r.push_back(gpu_of(stage, d, i));
    return r;
  };
  // The ranks holding the same weights, over which gradients are reduced: built here (grad_group), and in the
  // whole data-parallel ring the built ones stand for (symmetry reduction).
  const int grad_replicas = p.dp * p.cp;
  const int grad_ring = p.whole_dp() * p.whole_cp();
  const std::int32_t ring_ranks = grad_ring > grad_replicas ? grad_ring : 0;

  // Model states, resident for the whole step.
  std::vector<double> gpu_params(static_cast<std::size_t>(in.cluster.gpus()), 0);
  for (int stage = 0; stage < p.pp; ++stage) {
    double stage_params = layer_params * static_cast<double>(stage_layers[static_cast<std::size_t>(stage)]);
    if (stage == 0) stage_params += params.embedding / p.tp;
    if (stage == p.pp - 1) stage_params += static_cast<double>(model.vocab * h) / p.tp + params.final_norm;
    for (int d = 0; d < p.dp; ++d) {
      for (sim::DeviceId gpu : ranks_of(stage, d)) {
        gpu_params[static_cast<std::size_t>(gpu)] = stage_params;
        const auto& pol = in.precision;
        const double states_per_param = p.distributed_optimizer
                                            ? pol.weight_bytes + pol.grad_bytes + (pol.master_bytes + pol.optimizer_bytes) / grad_ring
                                            : pol.bytes_per_param();
        g.set_op(g.alloc("model states gpu" + std::to_string(gpu), gpu, sim::Pool::hbm,
                         static_cast<std::int64_t>(stage_params * states_per_param),
                         "model states (" + in.precision.name + ")"),
                 {sim::OpCode::states});
      }
    }
  }

  struct SlotTasks {
    std::vector<sim::TaskId> first, last, send;  // per TP rank
  };
  // [replica][virtual stage][micro-batch][forward = 0, backward = 1]
  std::vector<std::vector<std::vector<std::array<SlotTasks, 2>>>> slots(
      static_cast<std::size_t>(p.dp),
      std::vector<std::vector<std::array<SlotTasks, 2>>>(static_cast<std::size_t>(virtual_stages),
                                                         std::vector<std::array<SlotTasks, 2>>(static_cast<std::size_t>(mbs))));
  struct Bucket {
    int stage, t;
    double params;
    std::vector<sim::TaskId> ready;  // per replica and cp index
  };
  std::map<std::tuple<int, int, int>, Bucket> buckets;  // (stage, tp index, bucket index), in creation order below
  std::vector<std::tuple<int, int, int>> bucket_order;
  std::vector<sim::TaskId> last_compute(static_cast<std::size_t>(in.cluster.gpus()), -1);
  // Offloaded checkpoints: the D2H of each (replica, layer, micro-batch, TP rank), which the reload waits for.
  std::map<std::tuple<int, std::int64_t, std::int64_t, std::size_t>, sim::TaskId> checkpoint_d2h;

  for (int d = 0; d < p.dp; ++d) {
    for (int stage = 0; stage < p.pp; ++stage) {
      const std::vector<sim::DeviceId> ranks = ranks_of(stage, d);
      LayerEmitter layer(g, model, split, ranks);
      const auto schedule = pipeline_schedule(stage, p.pp, mbs, p.vpp);
      // The last backward of each chunk completes its gradients: buckets are cut there.
      std::vector<std::int64_t> last_backward_mb(static_cast<std::size_t>(p.vpp), -1);
      for (const auto& slot : schedule) {
        if (!slot.forward) last_backward_mb[static_cast<std::size_t>(slot.chunk)] = slot.micro_batch;
      }
      int bucket_index = 0;
      double bucket_params = 0;
      for (const auto& slot : schedule) {
        const int v = slot.chunk * p.pp + stage;
        const std::int64_t mb = slot.micro_batch;
        SlotTasks& tasks = slots[static_cast<std::size_t>(d)][static_cast<std::size_t>(v)][static_cast<std::size_t>(mb)][slot.forward ? 0 : 1];
        std::vector<sim::TaskId> last(ranks.size(), -1);
        const std::string tag = mb_name(mb);
        // What the tasks are in the model's terms (sim::Op): the step's sequence number of the micro-batch's first
        // sequence, one chunk (the whole sequence). The executor runs micro-batches of one sequence without TP.
        const auto seq = static_cast<std::int32_t>((d * mbs + mb) * p.micro_batch);
        auto at = [&](sim::OpCode code, std::int64_t l) { return sim::Op{code, seq, static_cast<std::int32_t>(l), 0, -1, -1}; };
        // Every slot opens with a zero-time task per rank that upstream stages' sends attach to.
        if (slot.forward) {
          for (std::size_t r = 0; r < ranks.size(); ++r) {
            // Allocated when the GPU reaches this slot (after its previous slot), not before.
            std::vector<sim::TaskId> after;
            if (last_compute[static_cast<std::size_t>(ranks[r])] >= 0) after.push_back(last_compute[static_cast<std::size_t>(ranks[r])]);
            // The activations this slot keeps for backward (checkpoints under full recompute; in host DRAM
            // with checkpoint offload).
            last[r] = g.alloc("F V" + std::to_string(v) + " " + tag + " activations", ranks[r],
                              p.offload_activations ? sim::Pool::dram : sim::Pool::hbm,
                              std::max<std::int64_t>(1, static_cast<std::int64_t>(act_per_layer * static_cast<double>(chunk_layers(v)))),
                              (p.offload_activations ? "offloaded checkpoints virtual stage " : "activations virtual stage ") +
                                  std::to_string(v) + " " + tag,
                              after);
            tasks.first.push_back(last[r]);
          }
          if (v == 0) {
            for (std::size_t r = 0; r < ranks.size(); ++r) {
              last[r] = emit_embedding(g, ranks[r], "F " + tag + " embedding", s, h, false, last[r], at(sim::OpCode::embed, 0));
            }
          }
          for (std::int64_t l = first_layer[static_cast<std::size_t>(v)]; l < first_layer[static_cast<std::size_t>(v) + 1]; ++l) {
            const std::string prefix = "F L" + std::to_string(l) + " " + tag;
            const auto working = full_recompute ? transient(ranks, prefix, last) : std::vector<sim::TaskId>{};
            layer.set_coordinates(seq, static_cast<int>(l), 0);
            layer.forward(prefix, last);
            for (std::size_t r = 0; r < working.size(); ++r) {
              std::vector<sim::TaskId> done{last[r]};
              if (p.offload_activations) {  // the layer input goes to host DRAM before its buffer is released
                done.push_back(g.copy(prefix + " D2H checkpoint", ranks[r],
                                      {sim::Copy::Direction::d2h, std::max<std::int64_t>(1, static_cast<std::int64_t>(act_per_layer)), offload.pinned},
                                      std::vector<sim::TaskId>{last[r]}));
                g.set_op(done.back(), at(sim::OpCode::input, l));
                checkpoint_d2h[{d, l, mb, r}] = done.back();
                if (offload.blocking) last[r] = done.back();  // the next layer waits for the copy
              }
              g.free(prefix + " release working activations", working[r], done);
            }
          }
          if (v == virtual_stages - 1) {
            for (std::size_t r = 0; r < ranks.size(); ++r) {
              last[r] = emit_loss(g, ranks[r], tag, s, h, vocab_shard, last[r], at(sim::OpCode::none, model.layers),
                                  loss_memory(in.cluster.stack));
            }
          }
          if (v + 1 < virtual_stages) {
            const int next_stage = (v + 1) % p.pp;
            if (next_stage != stage) {
              for (std::size_t r = 0; r < ranks.size(); ++r) {
                tasks.send.push_back(g.send("F V" + std::to_string(v) + " " + tag + " send act", ranks[r],
                                            gpu_of(next_stage, d, static_cast<int>(r)), std::max<std::int64_t>(1, 2 * s * h / p.tp),
                                            std::vector<sim::TaskId>{last[r]}, kPipeStream));
                g.set_op(tasks.send.back(), at(sim::OpCode::input, first_layer[static_cast<std::size_t>(v) + 1]));
              }
            }
          }
        } else {
          const auto begin = static_cast<sim::TaskId>(g.size());
          for (std::int64_t l = first_layer[static_cast<std::size_t>(v) + 1] - 1; l >= first_layer[static_cast<std::size_t>(v)]; --l) {
            const std::string prefix = "B L" + std::to_string(l) + " " + tag;
            std::vector<sim::TaskId> working;
            if (full_recompute) {
              if (p.offload_activations) {
                for (std::size_t r = 0; r < ranks.size(); ++r) {
                  std::vector<sim::TaskId> after{checkpoint_d2h.at({d, l, mb, r})};
                  if (last[r] >= 0) after.push_back(last[r]);
                  last[r] = g.copy(prefix + " H2D checkpoint", ranks[r],
                                   {sim::Copy::Direction::h2d, std::max<std::int64_t>(1, static_cast<std::int64_t>(act_per_layer)), offload.pinned},
                                   after);
                  g.set_op(last[r], at(sim::OpCode::input, l));
                }
              }
              working = transient(ranks, prefix, last);
              layer.set_coordinates(seq, static_cast<int>(l), 0);
              layer.forward("R L" + std::to_string(l) + " " + tag, last, true);
            }
            layer.set_coordinates(seq, static_cast<int>(l), 0);
            layer.backward(prefix, last);
            for (std::size_t r = 0; r < working.size(); ++r) {
              g.free(prefix + " release working activations", working[r], std::vector<sim::TaskId>{last[r]});
            }
            if (mb == last_backward_mb[static_cast<std::size_t>(slot.chunk)]) {
              bucket_params += layer_params;
              const bool chunk_done = l == first_layer[static_cast<std::size_t>(v)];
              if (bucket_params >= p.bucket_params || chunk_done) {
                // The last stage's first bucket also carries the LM head's gradients (computed before any layer's).
                const double head = stage == p.pp - 1 && bucket_index == 0 ? static_cast<double>(model.vocab * h) / p.tp + params.final_norm : 0;
                for (int t = 0; t < p.tp; ++t) {
                  const auto key = std::make_tuple(stage, t, bucket_index);
                  auto [it, inserted] = buckets.try_emplace(key, Bucket{stage, t, bucket_params + head, {}});
                  if (inserted) bucket_order.push_back(key);
                  for (int c = 0; c < p.cp; ++c) it->second.ready.push_back(last[static_cast<std::size_t>(c * p.tp + t)]);
                }
                ++bucket_index;
                bucket_params = 0;
              }
            }
          }
          if (v == 0) {
            for (std::size_t r = 0; r < ranks.size(); ++r) {
              last[r] = emit_embedding(g, ranks[r], "B " + tag + " embedding", s, h, true, last[r], at(sim::OpCode::embed_bwd, 0));
            }
            if (mb == last_backward_mb[0]) {  // the embedding's gradients join the last bucket, after its backward
              for (int t = 0; t < p.tp; ++t) {
                Bucket& b = buckets.at(std::make_tuple(stage, t, bucket_index - 1));
                if (d == 0) b.params += params.embedding / p.tp;
                for (int c = 0; c < p.cp; ++c) b.ready[b.ready.size() - static_cast<std::size_t>(p.cp - c)] = last[static_cast<std::size_t>(c * p.tp + t)];
              }
            }
          }
          // Upstream gradients attach to the slot's first task on each rank.
          for (sim::DeviceId rank : ranks) {
            for (auto id = begin; id < static_cast<sim::TaskId>(g.size()); ++id) {
              if (g.task(id).device == rank && g.task(id).kind() != sim::TaskKind::collective) {
                tasks.first.push_back(id);
                break;
              }
            }
          }
          // Activations of this slot are no longer needed.
          const SlotTasks& fwd = slots[static_cast<std::size_t>(d)][static_cast<std::size_t>(v)][static_cast<std::size_t>(mb)][0];
          for (std::size_t r = 0; r < ranks.size(); ++r) {
            g.free("B V" + std::to_string(v) + " " + tag + " free activations", fwd.first[r], std::vector<sim::TaskId>{last[r]});
          }
          if (v > 0) {
            const int prev_stage = (v - 1) % p.pp;
            if (prev_stage != stage) {
              for (std::size_t r = 0; r < ranks.size(); ++r) {
                tasks.send.push_back(g.send("B V" + std::to_string(v) + " " + tag + " send grad", ranks[r],
                                            gpu_of(prev_stage, d, static_cast<int>(r)), std::max<std::int64_t>(1, 2 * s * h / p.tp),
                                            std::vector<sim::TaskId>{last[r]}, kPipeStream));
                g.set_op(tasks.send.back(), at(sim::OpCode::input_grad, first_layer[static_cast<std::size_t>(v)]));
              }
            }
          }
        }
        tasks.last = last;
        for (std::size_t r = 0; r < ranks.size(); ++r) last_compute[static_cast<std::size_t>(ranks[r])] = last[r];
      }
    }
  }

  // Pipeline edges: a slot starts when its input arrives from the neighbouring virtual stage, by message when
  // that stage lives on another GPU, directly when it is on the same one.
  for (int d = 0; d < p.dp; ++d) {
    for (int v = 0; v < virtual_stages; ++v) {
      for (std::int64_t mb = 0; mb < mbs; ++mb) {
        auto& here = slots[static_cast<std::size_t>(d)][static_cast<std::size_t>(v)][static_cast<std::size_t>(mb)];
        auto link = [&](const SlotTasks& upstream, const SlotTasks& slot) {
          for (std::size_t r = 0; r < slot.first.size(); ++r) {
            g.add_dependency(upstream.send.empty() ? upstream.last[r] : upstream.send[r], slot.first[r]);
          }
        };
        if (v > 0) link(slots[static_cast<std::size_t>(d)][static_cast<std::size_t>(v - 1)][static_cast<std::size_t>(mb)][0], here[0]);
        if (v + 1 < virtual_stages) {
          link(slots[static_cast<std::size_t>(d)][static_cast<std::size_t>(v + 1)][static_cast<std::size_t>(mb)][1], here[1]);
        } else {
          link(here[0], here[1]);  // the last stage's backward starts from its own loss
        }
      }
    }
  }

  // Data-parallel gradient all-reduce, one collective per bucket, on its own stream so that it overlaps the
  // rest of the backward pass; then the optimizer step on each GPU.
  std::vector<std::vector<sim::TaskId>> gpu_reductions(static_cast<std::size_t>(in.cluster.gpus()));
  // The data-parallel x context-parallel ranks of (stage, TP index t), replica-major.
  auto grad_group = [&](int stage, int t) {
    std::vector<sim::DeviceId> members;
    for (int d = 0; d < p.dp; ++d) {
      for (int c = 0; c < p.cp; ++c) members.push_back(gpu_of(stage, d, c * p.tp + t));
    }
    return members;
  };
  if (grad_replicas > 1) {
    std::map<std::pair<int, int>, std::int32_t> groups;
    for (const auto& key : bucket_order) {
      const Bucket& b = buckets.at(key);
      auto [it, inserted] = groups.try_emplace({b.stage, b.t}, 0);
      if (inserted) it->second = g.add_group(grad_group(b.stage, b.t));
      const auto bytes = static_cast<std::int64_t>(b.params * in.precision.grad_bytes) / grad_ring * grad_ring + grad_ring;
      const sim::TaskId reduce = g.collective(
          std::string(p.distributed_optimizer ? "DP reduce-scatter" : "DP all-reduce") + " stage " + std::to_string(b.stage) +
              " tp" + std::to_string(b.t) + " bucket " + std::to_string(std::get<2>(key)),
          {p.distributed_optimizer ? sim::CollectiveOp::reduce_scatter : sim::CollectiveOp::all_reduce, sim::Algorithm::ring,
           it->second, bytes, ring_ranks},
          b.ready, kDpStream);
      g.set_op(reduce, {sim::OpCode::states});
      for (sim::DeviceId gpu : grad_group(b.stage, b.t)) gpu_reductions[static_cast<std::size_t>(gpu)].push_back(reduce);
    }
  }
  const int shards = p.distributed_optimizer ? grad_ring : 1;
  std::vector<sim::TaskId> step(static_cast<std::size_t>(in.cluster.gpus()));
  for (int gpu = 0; gpu < in.cluster.gpus(); ++gpu) {
    std::vector<sim::TaskId> deps = gpu_reductions[static_cast<std::size_t>(gpu)];
    if (last_compute[static_cast<std::size_t>(gpu)] >= 0) deps.push_back(last_compute[static_cast<std::size_t>(gpu)]);
    step[static_cast<std::size_t>(gpu)] =
        g.add({"optimizer step gpu" + std::to_string(gpu), gpu, {sim::StreamKind::compute, 0}, false,
               sim::OptimizerStep{static_cast<std::int64_t>(gpu_params[static_cast<std::size_t>(gpu)] * kAdamBytesPerParam / shards)},
               {sim::OpCode::optimizer, 0, -1, -1, gpu, gpu}},
              deps);
  }
  if (p.distributed_optimizer && grad_replicas > 1) {  // every data-parallel rank gets the others' updated weights
    for (int stage = 0; stage < p.pp; ++stage) {
      for (int t = 0; t < p.tp; ++t) {
        const std::vector<sim::DeviceId> members = grad_group(stage, t);
        std::vector<sim::TaskId> deps;
        for (sim::DeviceId gpu : members) deps.push_back(step[static_cast<std::size_t>(gpu)]);
        const double weights = gpu_params[static_cast<std::size_t>(members.front())] * in.precision.weight_bytes;
        g.collective("DP all-gather weights stage " + std::to_string(stage) + " tp" + std::to_string(t),
                     {sim::CollectiveOp::all_gather, sim::Algorithm::ring, g.add_group(members),
                      static_cast<std::int64_t>(weights) / grad_ring * grad_ring + grad_ring, ring_ranks},
                     deps, kDpStream);
      }
    }
  }
  return g;
}

}  // namespace trainyard::planner
