// Megatron-LM (NVIDIA/Megatron-LM at d98e8a64): pretrain_gpt.py's options for the megatron scheme. Where each is
// defined there: tests/data/engines/megatron-lm.txt.
#include "common/units.hpp"
#include "planner/engines/writers.hpp"

namespace trainyard::planner {

namespace {

const Engine& megatron_lm() { return engine_named("megatron"); }

// The model: the options both Megatrons share, then Megatron-LM's own spellings.
void add_model(const StepInputs& in, EngineLaunch& l) {
  const model::ModelConfig& m = in.model;
  add_megatron_shape(in, l);
  if (m.kv_heads != m.heads) {
    l.add("--group-query-attention");
    l.add("--num-query-groups", {engine_number(m.kv_heads)});
  }
  l.add("--normalization", {m.norm == model::Norm::rmsnorm ? "RMSNorm" : "LayerNorm"});
  l.add("--norm-epsilon", {engine_number(m.norm_epsilon)});
  if (m.rope_theta) {
    l.add("--position-embedding-type", {"rope"});
    l.add("--rotary-base", {engine_number(*m.rope_theta)});
  }
}

void add_precision(const StepInputs& in, EngineLaunch& l) {
  const std::string& p = in.precision.name;
  if (p == "bf16-mixed") {
    l.add("--bf16");
    l.add("--grad-reduce-in-bf16");  // else --bf16 reduces gradients in fp32, twice the plan's bytes
  } else if (p == "bf16-mixed-fp32-grads") {
    l.add("--bf16");
    l.add("--accumulate-allreduce-grads-in-fp32");
  } else if (p != "fp32") {
    refuse_export(megatron_lm(), "precision", "bf16-mixed, bf16-mixed-fp32-grads or fp32", p);
  }
}

void add_parallelism(const StepInputs& in, const MegatronParams& p, EngineLaunch& l) {
  l.add("--tensor-model-parallel-size", {engine_number(p.tp)});
  l.add("--pipeline-model-parallel-size", {engine_number(p.pp)});
  if (p.vpp > 1) l.add("--num-virtual-stages-per-pipeline-rank", {engine_number(p.vpp)});
  if (p.first_stage_layers > 0) l.add("--decoder-first-pipeline-num-layers", {engine_number(p.first_stage_layers)});
  if (p.last_stage_layers > 0) l.add("--decoder-last-pipeline-num-layers", {engine_number(p.last_stage_layers)});
  if (p.cp > 1) {
    l.add("--context-parallel-size", {engine_number(p.cp)});
    // Transformer Engine reads the type as given: its all-gather is spelled all_gather there.
    l.add("--cp-comm-type", {std::string(to_string(p.cp_comm))});
    if (p.cp_comm == CpComm::a2a_p2p) l.add("--hierarchical-context-parallel-sizes", {engine_number(p.cp_a2a), engine_number(p.cp / p.cp_a2a)});
  }
  if (p.sequence_parallel && p.tp > 1) l.add("--sequence-parallel");
  if (p.tp_comm_overlap) l.add("--tp-comm-overlap");
  if (p.distributed_optimizer) l.add("--use-distributed-optimizer");
  l.add("--micro-batch-size", {engine_number(p.micro_batch)});
  l.add("--global-batch-size", {engine_number(in.workload.global_batch)});
  if (p.tp > 1 || p.cp > 1) l.env.emplace_back("CUDA_DEVICE_MAX_CONNECTIONS", "1");  // Megatron asserts it (before Blackwell)
}

void add_recompute(const MegatronParams& p, EngineLaunch& l) {
  if (p.offload_activations) {
    refuse_export(megatron_lm(), "offload_activations",
                  "no offload of full-recompute checkpoints (Megatron-LM's --cpu-offloading-num-layers offloads activations, and refuses "
                  "recompute and pipeline parallelism)",
                  "true");
  }
  if (p.recompute == Recompute::full) {
    l.add("--recompute-granularity", {"full"});
    l.add("--recompute-method", {"uniform"});
    l.add("--recompute-num-layers", {"1"});
  } else if (p.recompute == Recompute::selective) {
    l.add("--recompute-granularity", {"selective"});
  }
}

}  // namespace

EngineLaunch megatron_lm_launch(const StepInputs& in, const PlanSpec& spec) {
  const MegatronParams& p = spec.as<MegatronParams>();
  EngineLaunch l;
  l.engine = megatron_lm().name;
  l.launcher = "torchrun";
  l.program = "pretrain_gpt.py";
  add_model(in, l);
  add_precision(in, l);
  add_parallelism(in, p, l);
  add_recompute(p, l);
  l.add("--attention-backend", {"flash"});
  // A short run that writes a PyTorch profiler trace of steps 10, 11 and 12 (the profiler's schedule warms up on
  // step 9, left out of the trace) for every rank, which `trainyard compare` reads: Megatron writes them to
  // <tensorboard-dir>/../torch_profile/rank-N.json.gz. --profile-ranks defaults to rank 0 alone.
  l.add("--train-iters", {"20"});
  l.add("--lr", {"0.0003"});
  l.add("--mock-data");
  l.add("--profile");
  l.add("--use-pytorch-profiler");
  l.add("--profile-step-start", {"10"});
  l.add("--profile-step-end", {"13"});
  std::vector<std::string> ranks;
  for (int r = 0; r < in.cluster.gpus(); ++r) ranks.push_back(engine_number(r));
  l.add("--profile-ranks", ranks);
  l.add("--tensorboard-dir", {"trainyard-run/tensorboard"});
  l.notes = {
      "Run from Megatron-LM's root (pretrain_gpt.py), or set the path to it.",
      "--mock-data and NullTokenizer stand in for your data: replace them with --data-path and your tokenizer (Megatron pads the "
      "vocabulary to a multiple of 128 x tp, which changes the LM head's size slightly).",
      "The profiler traces land in trainyard-run/torch_profile/rank-N.json.gz: `trainyard compare PREDICTED.json trainyard-run/torch_profile`."};
  return l;
}

}  // namespace trainyard::planner
