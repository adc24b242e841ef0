// DeepSpeed through Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed 4efb479d, DeepSpeed 0.19.6): pretrain_gpt.py's
// options and the DeepSpeed config for the ZeRO family's zero, ulysses and fpdt. Where each is defined:
// tests/data/engines/deepspeed.txt.
#include <nlohmann/json.hpp>

#include "planner/engines/writers.hpp"

namespace trainyard::planner {

namespace {

using Json = nlohmann::json;

const Engine& deepspeed() { return engine_named("deepspeed"); }

// The model: the options both Megatrons share, then Megatron-DeepSpeed's own spellings (--num-key-value-heads,
// lower-case norms, its RoPE switches).
void add_model(const StepInputs& in, EngineLaunch& l) {
  const model::ModelConfig& m = in.model;
  add_megatron_shape(in, l);
  if (m.kv_heads != m.heads) l.add("--num-key-value-heads", {engine_number(m.kv_heads)});
  l.add("--normalization", {m.norm == model::Norm::rmsnorm ? "rmsnorm" : "layernorm"});
  l.add("--layernorm-epsilon", {engine_number(m.norm_epsilon)});
  if (m.rope_theta) {
    l.add("--use-rotary-position-embeddings");
    l.add("--rotary-position-embeddings-theta", {engine_number(*m.rope_theta)});
  }
}

// The config's precision: bf16 (with fp32 gradient accumulation when the plan keeps fp32 gradients), or none.
void set_precision(const StepInputs& in, Json& config, EngineLaunch& l) {
  const std::string& p = in.precision.name;
  if (p == "fp32") return;
  if (p != "bf16-mixed" && p != "bf16-mixed-fp32-grads") refuse_export(deepspeed(), "precision", "bf16-mixed, bf16-mixed-fp32-grads or fp32", p);
  config["bf16"] = {{"enabled", true}};
  if (p == "bf16-mixed-fp32-grads") config["data_types"] = {{"grad_accum_dtype", "fp32"}};
  l.add("--bf16");
}

// ZeRO's stage and offloads. DeepSpeed moves gradients to the host with the optimizer (ZeRO-Offload), and
// parameters only at stage 3 (ZeRO-Infinity).
Json zero_optimization(const ZeroParams& z) {
  Json zero = {{"stage", z.stage}, {"contiguous_gradients", true}, {"overlap_comm", true}};
  const Json on_host = {{"device", "cpu"}, {"pin_memory", true}};
  if (z.offload_grads && !z.offload_optimizer) {
    refuse_export(deepspeed(), "offload", "grads offloaded with the optimizer (DeepSpeed's ZeRO-Offload moves both)", "grads without optimizer");
  }
  if (z.offload_optimizer) {
    if (z.stage < 1) refuse_export(deepspeed(), "zero_stage", "1 to 3 with the optimizer offloaded", "0");
    zero["offload_optimizer"] = on_host;
  }
  if (z.offload_params) {
    if (z.stage != 3) refuse_export(deepspeed(), "zero_stage", "3 with the parameters offloaded (ZeRO-Infinity)", std::to_string(z.stage));
    zero["offload_param"] = on_host;
  }
  return zero;
}

// Checkpointing: every layer (Megatron-DeepSpeed has no every-n-th), in host memory with OC.
void add_checkpointing(const ZeroParams& z, Json& config, EngineLaunch& l) {
  if (!z.activation_checkpointing && !z.offload_activations) return;
  if (z.activation_checkpointing && z.checkpoint_every != 1 && !z.offload_activations) {
    refuse_export(deepspeed(), "checkpoint_every", "1 (Megatron-DeepSpeed checkpoints every layer)", std::to_string(z.checkpoint_every));
  }
  l.add("--checkpoint-activations");
  l.add("--deepspeed-activation-checkpointing");
  config["activation_checkpointing"] = {{"partition_activations", false},
                                        {"cpu_checkpointing", z.offload_activations},
                                        {"contiguous_memory_optimization", false},
                                        {"synchronize_checkpoint_boundary", false}};
  if (z.offload_activations) l.add("--checkpoint-in-cpu");
}

// Ulysses and FPDT (DeepSpeed's sequence parallelism): FPDT's chunks in the whole sequence's tokens, its buffers
// offloaded to the host, as trainyard's FPDT streams them.
void add_sequence_parallelism(const StepInputs& in, const ZeroParams& z, EngineLaunch& l) {
  if (z.cp > 1) refuse_export(deepspeed(), "cp", "1 (DeepSpeed has no ring attention; torchtitan's context parallelism does)", std::to_string(z.cp));
  if (z.sp > 1) l.add("--ds-sequence-parallel-size", {engine_number(z.sp)});
  if (z.fpdt_chunk > 0) {
    l.add("--ds-sequence-parallel-fpdt");
    l.add("--ds-sequence-parallel-fpdt-chunk-size", {engine_number(z.fpdt_chunk)});
    l.add("--ds-sequence-parallel-fpdt-offloading");
  }
  (void)in;
}

}  // namespace

EngineLaunch deepspeed_launch(const StepInputs& in, const PlanSpec& spec) {
  const ZeroParams& z = spec.as<ZeroParams>();
  EngineLaunch l;
  l.engine = deepspeed().name;
  l.launcher = "deepspeed";
  l.program = "pretrain_gpt.py";
  const std::int64_t dp = in.cluster.gpus() / z.sp;  // Ulysses' groups are its data-parallel ranks' unit
  if (in.workload.global_batch % (z.micro_batch * dp) != 0) {
    refuse_export(deepspeed(), "micro_batch", "a micro-batch x data-parallel ranks dividing the global batch (DeepSpeed asserts the product)",
                  engine_number(z.micro_batch) + " x " + engine_number(dp) + " for " + engine_number(in.workload.global_batch));
  }
  Json config = {{"train_batch_size", in.workload.global_batch},
                 {"train_micro_batch_size_per_gpu", z.micro_batch},
                 {"gradient_accumulation_steps", in.workload.global_batch / (z.micro_batch * dp)}};
  add_model(in, l);
  set_precision(in, config, l);
  config["zero_optimization"] = zero_optimization(z);
  add_sequence_parallelism(in, z, l);
  add_checkpointing(z, config, l);
  l.add("--tensor-model-parallel-size", {"1"});
  l.add("--pipeline-model-parallel-size", {"1"});
  l.add("--no-pipeline-parallel");
  l.add("--micro-batch-size", {engine_number(z.micro_batch)});
  l.add("--global-batch-size", {engine_number(in.workload.global_batch)});
  l.add("--use-flash-attn-v2");
  l.add("--deepspeed");
  l.add("--deepspeed_config", {"$HERE/ds_config.json"});
  l.add("--zero-stage", {engine_number(z.stage)});
  l.add("--train-iters", {"20"});
  l.add("--lr", {"0.0003"});
  l.add("--data-path", {"$DATA_PATH"});
  // PyTorch profiler traces of steps 10 to 12 (megatron/profiler.py: tensorboard_trace_handler, gzip), which
  // `trainyard compare` reads.
  l.add("--profile", {"pt"});
  l.add("--profile_steps", {"10,12"});
  l.add("--tensorboard-dir", {"trainyard-run/tensorboard"});
  l.inputs.emplace_back("DATA_PATH", "your Megatron-DeepSpeed dataset prefix (preprocess_data.py's output, without .bin/.idx)");
  l.files.push_back({"ds_config.json", config.dump(2) + "\n"});
  l.notes = {
      "Run from Megatron-DeepSpeed's root (pretrain_gpt.py) with DeepSpeed installed.",
      "NullTokenizer stands in for your tokenizer: replace --tokenizer-type and --vocab-size with yours.",
      "The profiler traces land in trainyard-run/tensorboard/*.pt.trace.json.gz: `trainyard compare PREDICTED.json trainyard-run/tensorboard`."};
  return l;
}

}  // namespace trainyard::planner
