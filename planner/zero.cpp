#include "planner/zero.hpp"

#include <algorithm>

#include "common/error.hpp"

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
  auto fail = [](const std::string& flag, const std::string& expected, const std::string& got) {
    throw InputError(flag, "value", expected, got);
  };
  if (p.stage < 0 || p.stage > 3) fail("--zero-stage", "0, 1, 2 or 3", std::to_string(p.stage));
  if (p.sp < 1 || gpus % p.sp != 0) fail("--sp", "a divisor of the cluster's " + std::to_string(gpus) + " GPUs", std::to_string(p.sp));
  if (m.heads % p.sp != 0 || m.kv_heads % p.sp != 0) {
    fail("--sp", "a divisor of the heads (" + std::to_string(m.heads) + ") and kv heads (" + std::to_string(m.kv_heads) + ")",
         std::to_string(p.sp));
  }
  if (in.workload.seq_len % p.sp != 0) fail("--sp", "a divisor of the sequence length", std::to_string(p.sp));
  if (p.cp < 1 || gpus % p.cp != 0) fail("--cp", "a divisor of the cluster's " + std::to_string(gpus) + " GPUs", std::to_string(p.cp));
  if (p.cp > 1 && p.sp > 1) fail("--cp", "1 with --sp > 1 (Ulysses and ring attention are separate schemes here)", std::to_string(p.cp));
  if (in.workload.seq_len % (p.zigzag ? 2 * p.cp : p.cp) != 0) {
    fail("--cp", "a degree such that the sequence splits into " + std::string(p.zigzag ? "2 * cp" : "cp") + " equal chunks",
         std::to_string(p.cp));
  }
  if (p.zigzag && p.cp == 1) fail("--zigzag", "only with --cp > 1", "--cp 1");
  if (p.checkpoint_every < 1 || p.checkpoint_every > m.layers) {
    fail("--recompute", "activation checkpoints every 1 to " + std::to_string(m.layers) + " layers", std::to_string(p.checkpoint_every));
  }
  if (p.fpdt_chunk < 0 || (p.fpdt_chunk > 0 && (in.workload.seq_len % p.fpdt_chunk != 0 || p.fpdt_chunk % p.sp != 0))) {
    fail("--chunk", "a chunk (global tokens) dividing the sequence length and divisible by sp", std::to_string(p.fpdt_chunk));
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

LayerSplit zero_layer_split(const StepInputs& in, const ZeroParams& p) {
  LayerSplit split{p.micro_batch, in.workload.seq_len, 1, false, false};
  split.ulysses = p.sp;
  split.cp = p.cp;
  split.zigzag = p.zigzag;
  split.fpdt_chunks = p.fpdt_chunk > 0 ? static_cast<int>(in.workload.seq_len / p.fpdt_chunk) : 1;
  if (split.cp == 1 && split.fpdt_chunks == 1) split.score_bytes = stored_score_bytes(in.cluster);  // ring and FPDT attention are fused
  return split;
}

sim::TaskGraph build_zero(const StepInputs& in, const ZeroParams& p) {
  check_zero(in, p);
  const auto& model = in.model;
  const auto& offload = in.cluster.stack.checkpoint_offload;  // how --offload acts copies run
  const int gpus = in.cluster.gpus();
  const std::int64_t mbs = zero_micro_batches(in, p);
  const LayerSplit split = zero_layer_split(in, p);
  // A layer's activations while it runs (FPDT: a few chunks' worth; its attention tensors wait in host DRAM).
  const double full_acts = split.fpdt_chunks > 1 ? fpdt_working_bytes(model, split)
                                                 : layer_activation_bytes(model, split, Recompute::none).total();
  const double fpdt_host = split.fpdt_chunks > 1
                               ? static_cast<double>(split.local_tokens()) *
                                     (2.0 * static_cast<double>(2 * model.q_dim() + 2 * model.kv_dim()) + 4.0 * static_cast<double>(model.q_dim()))
                               : 0;
  const double ckpt = layer_activation_bytes(model, split, Recompute::full).total();
  const auto params = model.param_counts();
  const double layer_params = params.per_layer();
  const double resident_params = params.embedding + static_cast<double>(model.vocab * model.hidden) + params.final_norm;
  const double all_params = model.params();
  const double n = gpus;
  const std::int64_t s = split.local_tokens(), h = model.hidden;
  const auto& pol = in.precision;

  sim::TaskGraph g;
  std::vector<sim::DeviceId> everyone;
  for (int gpu = 0; gpu < gpus; ++gpu) everyone.push_back(gpu);
  const std::int32_t zero_group = gpus > 1 ? g.add_group(everyone) : -1;

  // Model states. The embedding and LM head stay whole on every GPU (not sharded by stage 3); the layers'
  // weights, gradients and optimizer states are sharded by stage and may live in host DRAM.
  const double layers_params = layer_params * static_cast<double>(model.layers);
  const double weights = pol.weight_bytes * ((p.stage == 3 ? layers_params / n : layers_params) + resident_params);
  const double grads = pol.grad_bytes * (p.stage >= 2 ? all_params / n : all_params);
  const double optimizer = (pol.master_bytes + pol.optimizer_bytes) * (p.stage >= 1 ? all_params / n : all_params);
  for (int gpu = 0; gpu < gpus; ++gpu) {
    const sim::DeviceId host = sim::host_device(in.cluster.node_of(gpu));
    const double host_weights = p.offload_params ? pol.weight_bytes * layers_params / n : 0;
    g.alloc("weights gpu" + std::to_string(gpu), gpu, sim::Pool::hbm, rounded(weights - host_weights, 1), "weights");
    if (host_weights > 0) g.alloc("host weights gpu" + std::to_string(gpu), host, sim::Pool::dram, rounded(host_weights, 1), "offloaded weights");
    g.alloc("grads gpu" + std::to_string(gpu), p.offload_grads ? host : gpu, p.offload_grads ? sim::Pool::dram : sim::Pool::hbm,
            rounded(grads, 1), "gradients");
    g.alloc("optimizer gpu" + std::to_string(gpu), p.offload_optimizer ? host : gpu,
            p.offload_optimizer ? sim::Pool::dram : sim::Pool::hbm, rounded(optimizer, 1), "master weights and Adam moments");
  }

  const int group_size = p.sp * p.cp;
  const int groups = gpus / group_size;
  std::vector<LayerEmitter> emitters;
  std::vector<std::vector<sim::DeviceId>> group_ranks;
  for (int grp = 0; grp < groups; ++grp) {
    std::vector<sim::DeviceId> ranks;
    for (int r = 0; r < group_size; ++r) ranks.push_back(grp * group_size + r);
    group_ranks.push_back(ranks);
    emitters.emplace_back(g, model, split, ranks);
  }
  std::vector<sim::TaskId> last(static_cast<std::size_t>(gpus), -1);  // each GPU's latest compute task
  auto ranks_last = [&](int grp) {
    std::vector<sim::TaskId> out;
    for (auto r : group_ranks[static_cast<std::size_t>(grp)]) out.push_back(last[static_cast<std::size_t>(r)]);
    return out;
  };
  auto store_last = [&](int grp, const std::vector<sim::TaskId>& values) {
    for (std::size_t i = 0; i < values.size(); ++i) last[static_cast<std::size_t>(group_ranks[static_cast<std::size_t>(grp)][i])] = values[i];
  };
  auto all_last = [&] {
    std::vector<sim::TaskId> deps;
    for (auto id : last) {
      if (id >= 0) deps.push_back(id);
    }
    return deps;
  };

  // Stage 3: the parameters of a layer are gathered into a whole-layer buffer on every GPU, one layer ahead of
  // the compute that needs them (the buffer for layer l is allocated once layer l - 2's is released).
  std::vector<sim::TaskId> gather_chain;  // the gathers issued so far, in order
  std::vector<std::vector<sim::TaskId>> gather_buffers;   // per gather, per GPU: the alloc of its buffer
  std::vector<std::vector<sim::TaskId>> gather_releases;  // per gather, per GPU: the free of its buffer
  auto gather_layer = [&](const std::string& name) -> sim::TaskId {
    if (p.stage != 3 || gpus == 1) return -1;
    std::vector<sim::TaskId> deps;
    if (!gather_chain.empty()) deps.push_back(gather_chain.back());
    std::vector<sim::TaskId> buffers;
    for (int gpu = 0; gpu < gpus; ++gpu) {
      // At most two layer buffers: this one waits until the buffer of two gathers ago is released.
      std::vector<sim::TaskId> after;
      const std::size_t k = gather_chain.size();
      if (k >= 2 && gather_releases[k - 2][static_cast<std::size_t>(gpu)] >= 0) {
        after.push_back(gather_releases[k - 2][static_cast<std::size_t>(gpu)]);
      }
      buffers.push_back(g.alloc(name + " buffer", gpu, sim::Pool::hbm, rounded(pol.weight_bytes * layer_params, 1),
                                "gathered layer parameters", after));
      deps.push_back(buffers.back());
      if (p.offload_params) {
        deps.push_back(g.copy(name + " H2D shard", gpu, {sim::Copy::Direction::h2d, rounded(pol.weight_bytes * layer_params / n, 1), true},
                              std::vector<sim::TaskId>{buffers.back()}));
      }
    }
    const sim::TaskId gather = g.collective(name, {sim::CollectiveOp::all_gather, sim::Algorithm::ring, zero_group,
                                                   rounded(pol.weight_bytes * layer_params, gpus)},
                                            deps, kGatherStream);
    gather_chain.push_back(gather);
    gather_buffers.push_back(buffers);
    gather_releases.emplace_back(static_cast<std::size_t>(gpus), -1);
    return gather;
  };
  auto release_gather = [&](std::size_t index, const std::string& name) {
    if (index >= gather_buffers.size()) return;
    for (int gpu = 0; gpu < gpus; ++gpu) {
      gather_releases[index][static_cast<std::size_t>(gpu)] =
          g.free(name + " release", gather_buffers[index][static_cast<std::size_t>(gpu)],
                 std::vector<sim::TaskId>{last[static_cast<std::size_t>(gpu)]});
    }
  };
  // A layer's compute waits for its gathered parameters: attach the gather to each GPU's first task of the
  // layer (emitted from `begin` on).
  auto needs_gather = [&](sim::TaskId gather, sim::TaskId begin) {
    if (gather < 0) return;
    for (int gpu = 0; gpu < gpus; ++gpu) {
      for (sim::TaskId id = begin; id < static_cast<sim::TaskId>(g.size()); ++id) {
        const auto& task = g.task(id);
        if (task.device == gpu && task.kind() != sim::TaskKind::collective && task.kind() != sim::TaskKind::alloc) {
          g.add_dependency(gather, id);
          break;
        }
      }
    }
  };

  // The stack's copy of a gathered layer's parameters out of the all-gather buffer (FSDP2), on each GPU's compute
  // stream once the gather has landed.
  const double copy_out_bytes = in.cluster.stack.gathered_params_copy_passes.value * pol.weight_bytes * layer_params;
  auto copy_out_gathered = [&](sim::TaskId gather, const std::string& name) {
    if (gather < 0 || copy_out_bytes <= 0) return;
    for (int gpu = 0; gpu < gpus; ++gpu) {
      auto& at = last[static_cast<std::size_t>(gpu)];
      std::vector<sim::TaskId> deps{gather};
      if (at >= 0) deps.push_back(at);
      at = g.elementwise(name + " copy out gathered params", gpu, {rounded(copy_out_bytes, 1), rounded(copy_out_bytes, 1)}, deps);
    }
  };

  // The gradient reduction's dtype and the stack's copy of a layer's gradients into its input buffer (FSDP2's
  // copy-in with the cast to reduce_dtype), on each GPU's compute stream before the reduction.
  const stacks::StackProfile& stack = in.cluster.stack;
  const double reduce_bytes_per_param = stack.gradient_reduce_bytes.value > 0 ? stack.gradient_reduce_bytes.value : pol.grad_bytes;
  const double copy_in_passes = stack.reduced_grads_copy_passes.value;
  auto copy_in_grads = [&](const std::string& name) {
    if (copy_in_passes <= 0) return;
    const double read = copy_in_passes * pol.grad_bytes * layer_params, written = copy_in_passes * reduce_bytes_per_param * layer_params;
    for (int gpu = 0; gpu < gpus; ++gpu) {
      auto& at = last[static_cast<std::size_t>(gpu)];
      at = g.elementwise(name + " copy in grads", gpu, {rounded(read, 1), rounded(written, 1)},
                         at >= 0 ? std::vector<sim::TaskId>{at} : std::vector<sim::TaskId>{});
    }
  };

  // FPDT keeps a layer's attention tensors (q, k, v, o, lse, and in backward dO, dq) in host DRAM while the
  // layer runs.
  auto fpdt_host_buffers = [&](const std::string& name) {
    std::vector<sim::TaskId> ids;
    if (fpdt_host <= 0) return ids;
    for (int gpu = 0; gpu < gpus; ++gpu) {
      std::vector<sim::TaskId> after;
      if (last[static_cast<std::size_t>(gpu)] >= 0) after.push_back(last[static_cast<std::size_t>(gpu)]);
      ids.push_back(g.alloc(name + " FPDT host buffers", sim::host_device(in.cluster.node_of(gpu)), sim::Pool::dram,
                            rounded(fpdt_host, 1), "FPDT attention tensors " + name, after));
    }
    return ids;
  };
  auto release_host_buffers = [&](const std::vector<sim::TaskId>& ids, const std::string& name) {
    for (std::size_t gpu = 0; gpu < ids.size(); ++gpu) {
      // Released once the layer's compute and the copies that read or write them are done: the copies are the
      // last tasks on the GPU's copy engines, so wait for the GPU's chain and every copy of this layer.
      std::vector<sim::TaskId> deps{last[gpu]};
      for (sim::TaskId id = ids.back() + 1; id < static_cast<sim::TaskId>(g.size()); ++id) {
        if (g.task(id).kind() == sim::TaskKind::copy && g.task(id).device == static_cast<sim::DeviceId>(gpu)) deps.push_back(id);
      }
      g.free(name + " release FPDT host buffers", ids[gpu], deps);
    }
  };

  std::vector<sim::TaskId> reductions;  // per GPU: gradient reductions the optimizer waits for
  for (std::int64_t mb = 0; mb < mbs; ++mb) {
    const std::string tag = "mb" + std::to_string(mb);
    const bool last_mb = mb == mbs - 1;
    // Forward.
    std::vector<std::vector<sim::TaskId>> saved(static_cast<std::size_t>(model.layers));  // per layer, per GPU
    for (int gpu = 0; gpu < gpus; ++gpu) {
      auto& at = last[static_cast<std::size_t>(gpu)];
      at = emit_embedding(g, gpu, "F " + tag + " embedding", s, h, false, at);
    }
    for (std::int64_t l = 0; l < model.layers; ++l) {
      const std::string prefix = "F L" + std::to_string(l) + " " + tag;
      const std::size_t gather_index = gather_chain.size();
      const sim::TaskId gather = gather_layer(prefix + " gather params");
      for (int gpu = 0; gpu < gpus; ++gpu) {
        std::vector<sim::TaskId> deps;
        if (last[static_cast<std::size_t>(gpu)] >= 0) deps.push_back(last[static_cast<std::size_t>(gpu)]);
        // Every layer's forward holds its full activations; with checkpointing only until the layer ends.
        saved[static_cast<std::size_t>(l)].push_back(
            g.alloc(prefix + " activations", gpu, sim::Pool::hbm, rounded(full_acts, 1), "activations " + prefix, deps));
        last[static_cast<std::size_t>(gpu)] = saved[static_cast<std::size_t>(l)].back();
      }
      const std::vector<sim::TaskId> host_buffers = fpdt_host_buffers(prefix);
      const auto begin = static_cast<sim::TaskId>(g.size());
      copy_out_gathered(gather, prefix);
      for (int grp = 0; grp < groups; ++grp) {
        auto chain = ranks_last(grp);
        emitters[static_cast<std::size_t>(grp)].forward(prefix, chain);
        store_last(grp, chain);
      }
      needs_gather(gather, begin);
      release_host_buffers(host_buffers, prefix);
      release_gather(gather_index, prefix);
      if (p.checkpoints_layer(l)) {
        // Keep only the layer input: the rest of this layer's activations are dropped (AC); with OC the input
        // goes to host DRAM as well.
        for (int gpu = 0; gpu < gpus; ++gpu) {
          const sim::TaskId alloc = saved[static_cast<std::size_t>(l)][static_cast<std::size_t>(gpu)];
          const sim::TaskId done = last[static_cast<std::size_t>(gpu)];
          // Trade the full activations for the checkpoint (the layer input): free them, keep a checkpoint-sized
          // allocation; with OC the checkpoint is copied to host DRAM and released on the GPU once copied.
          const sim::TaskId keep = g.alloc(prefix + " checkpoint", gpu, sim::Pool::hbm, rounded(ckpt, 1),
                                           "checkpoint " + prefix, std::vector<sim::TaskId>{done});
          g.free(prefix + " drop activations", alloc, std::vector<sim::TaskId>{keep});
          if (p.offload_activations) {
            const sim::DeviceId host = sim::host_device(in.cluster.node_of(gpu));
            const sim::TaskId host_copy = g.alloc(prefix + " host checkpoint", host, sim::Pool::dram, rounded(ckpt, 1),
                                                  "offloaded checkpoint " + prefix, std::vector<sim::TaskId>{keep});
            const sim::TaskId d2h = g.copy(prefix + " D2H checkpoint", gpu, {sim::Copy::Direction::d2h, rounded(ckpt, 1), offload.pinned},
                                           std::vector<sim::TaskId>{host_copy});
            if (offload.blocking) last[static_cast<std::size_t>(gpu)] = d2h;  // the next layer waits for the copy
            g.free(prefix + " release checkpoint", keep, std::vector<sim::TaskId>{d2h});
            saved[static_cast<std::size_t>(l)][static_cast<std::size_t>(gpu)] = host_copy;
          } else {
            saved[static_cast<std::size_t>(l)][static_cast<std::size_t>(gpu)] = keep;
          }
        }
      }
    }
    // FPDT computes the loss in its sequence chunks (DeepSpeed's FPDT_LogitsLoss); the others as the stack does.
    LossMemory loss = loss_memory(in.cluster.stack);
    if (split.fpdt_chunks > 1) loss.chunk_tokens = std::max<std::int64_t>(1, s / split.fpdt_chunks);
    // LM head and loss, forward and backward fused per chunk.
    for (int gpu = 0; gpu < gpus; ++gpu) {
      auto& at = last[static_cast<std::size_t>(gpu)];
      at = emit_loss(g, gpu, tag, s, h, model.vocab, at, {}, loss);
    }
    // Backward, last layer first.
    for (std::int64_t l = model.layers - 1; l >= 0; --l) {
      const std::string prefix = "B L" + std::to_string(l) + " " + tag;
      const std::size_t gather_index = gather_chain.size();
      const sim::TaskId gather = gather_layer(prefix + " gather params");
      std::vector<sim::TaskId> transient(static_cast<std::size_t>(gpus), -1);
      const bool checkpoint = p.checkpoints_layer(l);
      for (int gpu = 0; gpu < gpus; ++gpu) {
        auto& at = last[static_cast<std::size_t>(gpu)];
        if (checkpoint) {
          if (p.offload_activations) {
            at = g.copy(prefix + " H2D checkpoint", gpu, {sim::Copy::Direction::h2d, rounded(ckpt, 1), offload.pinned}, std::vector<sim::TaskId>{at});
          }
          // The recomputed layer's activations exist only while its backward runs.
          transient[static_cast<std::size_t>(gpu)] = g.alloc(prefix + " recomputed activations", gpu, sim::Pool::hbm,
                                                             rounded(full_acts, 1), "recomputed " + prefix, std::vector<sim::TaskId>{at});
          at = transient[static_cast<std::size_t>(gpu)];
        }
      }
      const std::vector<sim::TaskId> host_buffers = fpdt_host_buffers(prefix);
      const auto begin = static_cast<sim::TaskId>(g.size());
      copy_out_gathered(gather, prefix);
      for (int grp = 0; grp < groups; ++grp) {
        auto chain = ranks_last(grp);
        if (checkpoint) emitters[static_cast<std::size_t>(grp)].forward("R L" + std::to_string(l) + " " + tag, chain, true);
        emitters[static_cast<std::size_t>(grp)].backward(prefix, chain);
        store_last(grp, chain);
      }
      needs_gather(gather, begin);
      release_host_buffers(host_buffers, prefix);
      for (int gpu = 0; gpu < gpus; ++gpu) {
        const sim::TaskId done = last[static_cast<std::size_t>(gpu)];
        if (transient[static_cast<std::size_t>(gpu)] >= 0) {
          g.free(prefix + " free recomputed", transient[static_cast<std::size_t>(gpu)], std::vector<sim::TaskId>{done});
        }
        g.free(prefix + " free saved", saved[static_cast<std::size_t>(l)][static_cast<std::size_t>(gpu)], std::vector<sim::TaskId>{done});
      }
      release_gather(gather_index, prefix);
      // Gradients of this layer: reduce-scattered every micro-batch (stages 2-3) or all-reduced once (0-1).
      if (gpus > 1 && (p.stage >= 2 || last_mb)) {
        const auto op = p.stage >= 2 ? sim::CollectiveOp::reduce_scatter : sim::CollectiveOp::all_reduce;
        copy_in_grads(prefix);
        const sim::TaskId reduce = g.collective(prefix + (p.stage >= 2 ? " reduce-scatter grads" : " all-reduce grads"),
                                                {op, sim::Algorithm::ring, zero_group, rounded(reduce_bytes_per_param * layer_params, gpus)},
                                                all_last(), kReduceStream);
        reductions.push_back(reduce);
        if (p.offload_grads && last_mb) {
          for (int gpu = 0; gpu < gpus; ++gpu) {
            reductions.push_back(g.copy(prefix + " D2H grads", gpu,
                                        {sim::Copy::Direction::d2h, rounded(pol.grad_bytes * layer_params / n, 1), true},
                                        std::vector<sim::TaskId>{reduce}));
          }
        }
      }
    }
    for (int gpu = 0; gpu < gpus; ++gpu) {
      auto& at = last[static_cast<std::size_t>(gpu)];
      at = emit_embedding(g, gpu, "B " + tag + " embedding", s, h, true, at);
    }
  }

  // Optimizer step over each GPU's shard (all of it at stage 0), on the GPU or on its node's host, then the
  // updated parameters go back to where the next step reads them.
  const double shard = p.stage >= 1 ? all_params / n : all_params;
  std::vector<sim::TaskId> updated;
  for (int gpu = 0; gpu < gpus; ++gpu) {
    std::vector<sim::TaskId> deps = reductions;
    if (last[static_cast<std::size_t>(gpu)] >= 0) deps.push_back(last[static_cast<std::size_t>(gpu)]);
    const auto bytes = rounded(shard * kAdamBytesPerParam, 1);
    if (p.offload_optimizer) {
      const sim::DeviceId host = sim::host_device(in.cluster.node_of(gpu));
      const sim::TaskId step = g.add({"optimizer step host for gpu" + std::to_string(gpu), host, {sim::StreamKind::host, 0}, false,
                                      sim::OptimizerStep{bytes}}, deps);
      updated.push_back(p.offload_params ? step
                                         : g.copy("H2D updated params gpu" + std::to_string(gpu), gpu,
                                                  {sim::Copy::Direction::h2d, rounded(pol.weight_bytes * shard, 1), true},
                                                  std::vector<sim::TaskId>{step}));
    } else {
      updated.push_back(g.add({"optimizer step gpu" + std::to_string(gpu), gpu, {sim::StreamKind::compute, 0}, false,
                               sim::OptimizerStep{bytes}}, deps));
    }
  }
  if (gpus > 1 && (p.stage == 1 || p.stage == 2)) {
    g.collective("all-gather updated params", {sim::CollectiveOp::all_gather, sim::Algorithm::ring, zero_group,
                                               rounded(pol.weight_bytes * all_params, gpus)},
                 updated, kGatherStream);
  }
  return g;
}

}  // namespace trainyard::planner
