// torchtitan v0.2.2 (pytorch/torchtitan 73a0e697, its last release with TOML job configs): train.toml for the
// megatron scheme (TP, PP, pure DP) and the ZeRO family's zero and ring-attention (FSDP, context parallelism).
// Where each key is defined: tests/data/engines/torchtitan.txt.
#include <sstream>
#include <variant>

#include "common/error.hpp"
#include "planner/engines/writers.hpp"

namespace trainyard::planner {

namespace {

const Engine& torchtitan() { return engine_named("torchtitan"); }

// A TOML file of flat sections: strings, integers, booleans and lists of strings, in the order given.
class Toml {
 public:
  using Value = std::variant<std::string, std::int64_t, bool, std::vector<std::string>>;
  void set(const std::string& section, const std::string& key, Value value) {
    auto& entries = sections_[index(section)].second;
    entries.emplace_back(key, std::move(value));
  }
  std::string text() const {
    std::ostringstream out;
    for (const auto& [name, entries] : sections_) {
      out << "\n[" << name << "]\n";
      for (const auto& [key, value] : entries) out << key << " = " << format(value) << "\n";
    }
    return out.str();
  }

 private:
  std::size_t index(const std::string& section) {
    for (std::size_t i = 0; i < sections_.size(); ++i) {
      if (sections_[i].first == section) return i;
    }
    sections_.push_back({section, {}});
    return sections_.size() - 1;
  }
  static std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (static_cast<unsigned char>(c) < 0x20) throw InternalError("a control character in a TOML string", __FILE__, __LINE__);
      out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    }
    return out + "\"";
  }
  static std::string format(const Value& v) {
    if (const auto* s = std::get_if<std::string>(&v)) return quoted(*s);
    if (const auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
    if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
    std::string out = "[";
    for (const auto& s : std::get<std::vector<std::string>>(v)) out += (out.size() > 1 ? ", " : "") + quoted(s);
    return out + "]";
  }
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, Value>>>> sections_;
};

// torchtitan builds its models from named flavors (torchtitan/models/llama3/__init__.py at v0.2.2): the model
// must be one of them. The FFN width is the flavor's multiple_of rounding of ffn_dim_multiplier x 8 dim / 3.
struct Flavor {
  const char* name;
  std::int64_t layers, hidden, heads, kv_heads, ffn_hidden;
};
constexpr Flavor kLlama3Flavors[] = {
    {"8B", 32, 4096, 32, 8, 14336},
    {"70B", 80, 8192, 64, 8, 28672},
    {"405B", 126, 16384, 128, 8, 53248},
};
constexpr double kLlama3RopeTheta = 500000;

const Flavor& flavor_of(const model::ModelConfig& m) {
  std::string names;
  for (const Flavor& f : kLlama3Flavors) {
    if (f.layers == m.layers && f.hidden == m.hidden && f.heads == m.heads && f.kv_heads == m.kv_heads && f.ffn_hidden == m.ffn_hidden &&
        m.rope_theta == kLlama3RopeTheta && !m.tied_embeddings && m.activation == model::Activation::swiglu && m.norm == model::Norm::rmsnorm) {
      return f;
    }
    names += std::string(names.empty() ? "" : ", ") + f.name;
  }
  refuse_export(torchtitan(), "model",
                "the shape of one of torchtitan's llama3 flavors (" + names +
                    ": torchtitan/models/llama3/__init__.py; register another shape there as a flavor)",
                m.name + " (" + std::to_string(m.layers) + " layers, hidden " + std::to_string(m.hidden) + ")");
}

// `local_batch_size`: sequences per data-parallel rank in one forward-backward (torchtitan accumulates gradients up
// to global_batch_size).
void set_common(const StepInputs& in, std::int64_t local_batch_size, Toml& toml) {
  const std::string& p = in.precision.name;
  if (p != "bf16-mixed-fp32-grads" && p != "fp32") {
    refuse_export(torchtitan(), "precision",
                  "bf16-mixed-fp32-grads or fp32 (torchtitan reduces gradients in fp32: mixed_precision_reduce takes float32 only)", p);
  }
  toml.set("job", "dump_folder", std::string("./trainyard-run"));
  toml.set("job", "description", std::string("trainyard export"));
  // Traces of step 10 of 20 for every rank: <dump_folder>/profile_trace/iteration_10/rank<r>_trace.json.
  toml.set("profiling", "enable_profiling", true);
  toml.set("profiling", "save_traces_folder", std::string("profile_trace"));
  toml.set("profiling", "profile_freq", std::int64_t{10});
  toml.set("model", "name", std::string("llama3"));
  toml.set("model", "flavor", std::string(flavor_of(in.model).name));
  toml.set("model", "hf_assets_path", "./assets/hf/Llama-3.1-" + std::string(flavor_of(in.model).name));
  toml.set("optimizer", "name", std::string("AdamW"));
  toml.set("training", "local_batch_size", local_batch_size);
  toml.set("training", "global_batch_size", in.workload.global_batch);
  toml.set("training", "seq_len", in.workload.seq_len);
  toml.set("training", "steps", std::int64_t{20});
  toml.set("training", "dataset", std::string("c4_test"));
  toml.set("training", "mixed_precision_param", std::string(p == "fp32" ? "float32" : "bfloat16"));
  toml.set("training", "mixed_precision_reduce", std::string("float32"));
}

EngineLaunch launch_of(Toml& toml) {
  EngineLaunch l;
  l.engine = torchtitan().name;
  l.launcher = "torchrun";
  l.program = "-m torchtitan.train";
  l.add("--job.config_file", {"$HERE/train.toml"});
  l.files.push_back({"train.toml", "# Written by `trainyard export --to torchtitan` for " + torchtitan().version + "\n" + toml.text()});
  l.notes = {"Run from torchtitan's root with its tokenizer downloaded (scripts/download_hf_assets.py) to [model] hf_assets_path.",
             "[training] dataset c4_test is torchtitan's small test set: set your dataset there.",
             "The profiler traces land in trainyard-run/profile_trace/iteration_10/rank<r>_trace.json: "
             "`trainyard compare PREDICTED.json trainyard-run/profile_trace/iteration_10`."};
  return l;
}

}  // namespace

EngineLaunch torchtitan_megatron_launch(const StepInputs& in, const PlanSpec& spec) {
  const MegatronParams& p = spec.as<MegatronParams>();
  const Engine& e = torchtitan();
  if (p.dp > 1 && (p.tp > 1 || p.pp > 1 || p.cp > 1)) {
    refuse_export(e, "dp", "1 with tp, pp or cp (torchtitan replicates data-parallel ranks (DDP) only alone; its FSDP shards the parameters too)",
                  std::to_string(p.dp));
  }
  if (p.cp > 1)
    refuse_export(e, "cp", "1 (torchtitan shards the parameters over its context-parallel ranks; Megatron keeps them whole)", std::to_string(p.cp));
  if (p.distributed_optimizer) refuse_export(e, "distributed_optimizer", "false (torchtitan has no ZeRO-1: FSDP shards the parameters too)", "true");
  if (p.tp > 1 && !p.sequence_parallel) {
    refuse_export(e, "sequence_parallel", "true with tp > 1 (torchtitan's tensor parallelism always splits the norms' rows)", "false");
  }
  if (p.recompute == Recompute::selective) {
    refuse_export(e, "recompute", "none or full (torchtitan's selective checkpointing saves per op, not Megatron's core attention)", "selective");
  }
  if (p.offload_activations) refuse_export(e, "offload_activations", "false (torchtitan offloads no activations)", "true");
  if (p.first_stage_layers > 0 || p.last_stage_layers > 0) {
    refuse_export(e, "first_stage_layers", "0: an even split of the layers over the stages", std::to_string(p.first_stage_layers));
  }
  if (in.model.layers % (p.pp * p.vpp) != 0) {
    refuse_export(e, "pp", "a pp x vpp dividing the layers (torchtitan's stages hold pipeline_parallel_layers_per_stage each)",
                  std::to_string(p.pp * p.vpp) + " for " + std::to_string(in.model.layers) + " layers");
  }
  // torchtitan's maybe_enable_amp (torchtitan/distributed/utils.py): without FSDP, TP or PP train in fp32.
  if ((p.tp > 1 || p.pp > 1) && in.precision.name != "fp32") {
    refuse_export(e, "precision", "fp32 with tp or pp and no FSDP (torchtitan v0.2.2 turns mixed precision off there)", in.precision.name);
  }
  Toml toml;
  // With a pipeline every micro-batch of the step runs in one schedule; without one they are accumulated.
  set_common(in, p.pp > 1 ? in.workload.global_batch / p.dp : p.micro_batch, toml);
  toml.set("parallelism", "data_parallel_replicate_degree", std::int64_t{p.dp});
  toml.set("parallelism", "data_parallel_shard_degree", std::int64_t{1});
  toml.set("parallelism", "tensor_parallel_degree", std::int64_t{p.tp});
  // Megatron's TP communication overlap is torchtitan's async TP, which needs torch.compile.
  toml.set("parallelism", "enable_async_tensor_parallel", p.tp_comm_overlap);
  toml.set("parallelism", "pipeline_parallel_degree", std::int64_t{p.pp});
  if (p.pp > 1) {
    toml.set("parallelism", "pipeline_parallel_schedule", std::string(p.vpp > 1 ? "Interleaved1F1B" : "1F1B"));
    toml.set("parallelism", "pipeline_parallel_layers_per_stage", in.model.layers / (p.pp * p.vpp));
    // torchtitan counts the embedding and the head as a layer's worth each unless told not to.
    toml.set("parallelism", "pipeline_parallel_first_stage_less_layers", std::int64_t{0});
    toml.set("parallelism", "pipeline_parallel_last_stage_less_layers", std::int64_t{0});
    toml.set("parallelism", "pipeline_parallel_microbatch_size", p.micro_batch);
  }
  toml.set("parallelism", "context_parallel_degree", std::int64_t{1});
  toml.set("activation_checkpoint", "mode", std::string(p.recompute == Recompute::full ? "full" : "none"));
  toml.set("compile", "enable", p.tp_comm_overlap);
  toml.set("compile", "components", std::vector<std::string>{"model", "loss"});
  return launch_of(toml);
}

EngineLaunch torchtitan_zero_launch(const StepInputs& in, const PlanSpec& spec) {
  const ZeroParams& z = spec.as<ZeroParams>();
  const Engine& e = torchtitan();
  if (z.sp > 1) refuse_export(e, "sp", "1 (torchtitan has no Ulysses)", std::to_string(z.sp));
  if (z.fpdt_chunk > 0) refuse_export(e, "chunk", "0 (torchtitan has no FPDT)", std::to_string(z.fpdt_chunk));
  if (z.stage == 1 || (z.stage == 0 && z.cp > 1)) {
    refuse_export(e, "zero_stage", "3 or 2 (FSDP, resharded after forward or not), or 0 without cp (DDP)", std::to_string(z.stage));
  }
  if (z.cp > 1 && !z.zigzag) refuse_export(e, "zigzag", "true (torchtitan balances causal context parallelism head-to-tail, as zigzag)", "false");
  // FSDP's CPU offload moves parameters, gradients and optimizer states together.
  const bool offloads = z.offload_optimizer || z.offload_grads || z.offload_params;
  if (offloads && !(z.offload_optimizer && z.offload_grads && z.offload_params && z.stage == 3)) {
    refuse_export(e, "offload", "none, or optimizer,grads,params with zero_stage 3 (torchtitan's enable_cpu_offload moves all three)",
                  std::string(z.offload_optimizer ? "optimizer " : "") + (z.offload_grads ? "grads " : "") + (z.offload_params ? "params" : ""));
  }
  if (z.offload_activations) refuse_export(e, "offload", "no acts (torchtitan offloads no activations)", "acts");
  Toml toml;
  set_common(in, z.micro_batch, toml);
  if (offloads) toml.set("training", "enable_cpu_offload", true);
  const std::int64_t gpus = in.cluster.gpus();
  toml.set("parallelism", "data_parallel_replicate_degree", z.stage == 0 ? gpus : std::int64_t{1});
  toml.set("parallelism", "data_parallel_shard_degree", z.stage == 0 ? std::int64_t{1} : gpus / z.cp);
  if (z.stage == 2) toml.set("parallelism", "fsdp_reshard_after_forward", std::string("never"));  // ZeRO-2: parameters kept after forward
  toml.set("parallelism", "tensor_parallel_degree", std::int64_t{1});
  toml.set("parallelism", "pipeline_parallel_degree", std::int64_t{1});
  toml.set("parallelism", "context_parallel_degree", std::int64_t{z.cp});
  if (z.cp > 1) toml.set("parallelism", "context_parallel_rotate_method", std::string("alltoall"));  // K/V shards passed on, as a ring
  const bool every_layer = z.checkpoint_every == 1;
  toml.set("activation_checkpoint", "mode", std::string(!z.activation_checkpointing ? "none" : every_layer ? "full" : "selective"));
  if (z.activation_checkpointing && !every_layer) toml.set("activation_checkpoint", "selective_ac_option", std::to_string(z.checkpoint_every));
  toml.set("compile", "enable", false);
  toml.set("compile", "components", std::vector<std::string>{"model", "loss"});
  return launch_of(toml);
}

}  // namespace trainyard::planner
