// `trainyard export` (planner/engines/): each engine's launch holds only options and keys the engine's repository
// defines at the targeted version (tests/data/engines/, each with where it is defined), their values follow the
// plan, and what an engine cannot express is refused naming the parameter and the engine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/engines/launch.hpp"
#include "planner/schemes/scheme.hpp"
#include "test_support.hpp"

namespace trainyard {
namespace {

using planner::EngineLaunch;
using planner::PlanSpec;

// The first column of tests/data/engines/NAME.txt: every option or key the engine defines that export may write.
std::set<std::string> known(const std::string& name) {
  std::ifstream in(std::string(TRAINYARD_TEST_DATA_DIR) + "/engines/" + name + ".txt");
  EXPECT_TRUE(in) << name;
  std::set<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    out.insert(line.substr(0, line.find('\t')));
  }
  return out;
}

struct Rig {
  model::ModelConfig model;
  sim::Cluster cluster;
  planner::Workload workload;
  model::PrecisionPolicy precision = model::precision_policy("bf16-mixed");
  planner::StepInputs in() const { return {model, cluster, workload, precision}; }
};
Rig llama8b(int nodes = 2, std::int64_t seq = 32768, std::int64_t batch = 16) {
  return {model::load_model("llama3-8b"), sim::Cluster(hw::load_node("dgx-h100"), nodes), {seq, batch}};
}

// The value given with `option` (its first), or "" when the launch has the option without values; fails when absent.
std::string value_of(const EngineLaunch& l, const std::string& option) {
  for (const auto& arg : l.args) {
    if (arg[0] == option) return arg.size() > 1 ? arg[1] : "";
  }
  ADD_FAILURE() << option << " missing";
  return "";
}
bool has(const EngineLaunch& l, const std::string& option) {
  for (const auto& arg : l.args) {
    if (arg[0] == option) return true;
  }
  return false;
}

void expect_known_options(const EngineLaunch& l, const std::set<std::string>& names) {
  for (const auto& arg : l.args) EXPECT_TRUE(names.count(arg[0])) << arg[0] << " is not an option of the targeted " << l.engine;
}

// Every key of a JSON object as a dotted path ("zero_optimization.offload_optimizer.device").
void json_paths(const nlohmann::json& j, const std::string& prefix, std::set<std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    out.insert(path);
    if (it.value().is_object()) json_paths(it.value(), path, out);
  }
}

// The TOML's "section.key" names and values (export writes flat sections of key = value lines).
std::map<std::string, std::string> toml_keys(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      EXPECT_EQ(line.back(), ']') << line;
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const auto eq = line.find(" = ");
    EXPECT_NE(eq, std::string::npos) << line;
    out[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

const std::string& file_text(const EngineLaunch& l, const std::string& name) {
  for (const auto& f : l.files) {
    if (f.name == name) return f.text;
  }
  ADD_FAILURE() << name << " not written";
  static const std::string none;
  return none;
}

PlanSpec megatron(int tp, int pp, int dp, int cp = 1) {
  PlanSpec s = planner::scheme_named("megatron").blank();
  s.as<planner::MegatronParams>().tp = tp;
  s.as<planner::MegatronParams>().pp = pp;
  s.as<planner::MegatronParams>().dp = dp;
  s.as<planner::MegatronParams>().cp = cp;
  s.as<planner::MegatronParams>().sequence_parallel = tp > 1;
  return s;
}
PlanSpec zero_family(const std::string& scheme, int stage) {
  PlanSpec s = planner::scheme_named(scheme).blank();
  s.as<planner::ZeroParams>().stage = stage;
  return s;
}

TEST(Export, MegatronLmGetsTheParallelismModelAndBatchOfThePlan) {
  const auto names = known("megatron-lm");
  const Rig rig = llama8b();
  PlanSpec tp_pp = megatron(4, 2, 2);
  tp_pp.as<planner::MegatronParams>().vpp = 2;
  tp_pp.as<planner::MegatronParams>().distributed_optimizer = true;
  tp_pp.as<planner::MegatronParams>().recompute = planner::Recompute::full;
  const EngineLaunch a = planner::export_plan(rig.in(), tp_pp, "megatron");
  expect_known_options(a, names);
  EXPECT_EQ(value_of(a, "--tensor-model-parallel-size"), "4");
  EXPECT_EQ(value_of(a, "--pipeline-model-parallel-size"), "2");
  EXPECT_EQ(value_of(a, "--num-virtual-stages-per-pipeline-rank"), "2");
  EXPECT_TRUE(has(a, "--sequence-parallel"));
  EXPECT_TRUE(has(a, "--use-distributed-optimizer"));
  EXPECT_EQ(value_of(a, "--recompute-granularity"), "full");
  EXPECT_EQ(value_of(a, "--num-query-groups"), "8");
  EXPECT_EQ(value_of(a, "--ffn-hidden-size"), "14336");
  EXPECT_EQ(value_of(a, "--rotary-base"), "500000");
  EXPECT_EQ(value_of(a, "--seq-length"), "32768");
  EXPECT_EQ(value_of(a, "--global-batch-size"), "16");
  ASSERT_EQ(a.env.size(), 1u);  // TP: Megatron asserts one CUDA connection
  EXPECT_EQ(a.env[0], (std::pair<std::string, std::string>{"CUDA_DEVICE_MAX_CONNECTIONS", "1"}));

  PlanSpec hcp = megatron(1, 1, 2, 8);  // all-to-alls in groups of 2, the ring over 4 groups
  hcp.as<planner::MegatronParams>().cp_comm = planner::CpComm::a2a_p2p;
  hcp.as<planner::MegatronParams>().cp_a2a = 2;
  const EngineLaunch b = planner::export_plan(rig.in(), hcp, "megatron");
  expect_known_options(b, names);
  EXPECT_EQ(value_of(b, "--cp-comm-type"), "a2a+p2p");
  ASSERT_TRUE(has(b, "--hierarchical-context-parallel-sizes"));
  for (const auto& arg : b.args) {
    if (arg[0] == "--hierarchical-context-parallel-sizes") {
      EXPECT_EQ(arg, (std::vector<std::string>{arg[0], "2", "4"}));
    }
  }
  EXPECT_TRUE(has(b, "--grad-reduce-in-bf16"));  // bf16-mixed: bf16 gradients on the wire, as the plan counts them
  EXPECT_FALSE(has(b, "--sequence-parallel"));

  const EngineLaunch plain = planner::export_plan(rig.in(), megatron(1, 1, 16), "megatron");
  EXPECT_TRUE(plain.env.empty());  // no TP or CP: nothing to assert
  PlanSpec offloaded = megatron(1, 1, 16);
  offloaded.as<planner::MegatronParams>().recompute = planner::Recompute::full;
  offloaded.as<planner::MegatronParams>().offload_activations = true;
  const std::string refused = test::error_of([&] { planner::export_plan(rig.in(), offloaded, "megatron"); });
  EXPECT_NE(refused.find("offload_activations"), std::string::npos) << refused;
  EXPECT_NE(refused.find("megatron"), std::string::npos) << refused;
}

TEST(Export, DeepSpeedGetsZeroOffloadAndSequenceParallelismInItsConfig) {
  const auto names = known("deepspeed");
  const Rig rig = llama8b();
  PlanSpec fpdt = zero_family("fpdt", 3);
  fpdt.as<planner::ZeroParams>().sp = 8;
  fpdt.as<planner::ZeroParams>().fpdt_chunk = 65536;
  fpdt.as<planner::ZeroParams>().micro_batch = 1;
  fpdt.as<planner::ZeroParams>().activation_checkpointing = true;
  fpdt.as<planner::ZeroParams>().offload_optimizer = true;
  fpdt.as<planner::ZeroParams>().offload_params = true;
  const planner::StepInputs in{rig.model, rig.cluster, {262144, 4}, rig.precision};
  const EngineLaunch l = planner::export_plan(in, fpdt, "deepspeed");
  expect_known_options(l, names);
  EXPECT_EQ(value_of(l, "--ds-sequence-parallel-size"), "8");
  EXPECT_EQ(value_of(l, "--ds-sequence-parallel-fpdt-chunk-size"), "65536");
  EXPECT_EQ(value_of(l, "--zero-stage"), "3");
  const auto config = nlohmann::json::parse(file_text(l, "ds_config.json"));
  std::set<std::string> paths;
  json_paths(config, "", paths);
  for (const auto& path : paths) EXPECT_TRUE(names.count(path)) << path << " is not a key of the targeted DeepSpeed";
  // 16 GPUs in 2 Ulysses groups of 8: the batch of 4 is 2 accumulated micro-batches of 1 per group.
  EXPECT_EQ(config["train_batch_size"].get<std::int64_t>(), 4);
  EXPECT_EQ(config["train_batch_size"].get<std::int64_t>(),
            config["train_micro_batch_size_per_gpu"].get<std::int64_t>() * config["gradient_accumulation_steps"].get<std::int64_t>() * (16 / 8));
  EXPECT_EQ(config["zero_optimization"]["offload_param"]["device"], "cpu");
  EXPECT_EQ(config["zero_optimization"]["offload_optimizer"]["device"], "cpu");

  PlanSpec grads_alone = zero_family("zero", 2);
  grads_alone.as<planner::ZeroParams>().offload_grads = true;
  const std::string refused = test::error_of([&] { planner::export_plan(rig.in(), grads_alone, "deepspeed"); });
  EXPECT_NE(refused.find("offload"), std::string::npos) << refused;
  EXPECT_NE(refused.find("deepspeed"), std::string::npos) << refused;
  PlanSpec ring = zero_family("ring-attention", 3);
  ring.as<planner::ZeroParams>().cp = 4;
  ring.as<planner::ZeroParams>().zigzag = true;
  EXPECT_NE(test::error_of([&] { planner::export_plan(rig.in(), ring, "deepspeed"); }).find("scheme"), std::string::npos);
}

TEST(Export, TorchtitanGetsATomlOfItsOwnKeysOrNamesWhatItLacks) {
  const auto names = known("torchtitan");
  Rig rig = llama8b();
  rig.precision = model::precision_policy("bf16-mixed-fp32-grads");  // torchtitan reduces gradients in fp32
  PlanSpec ring = zero_family("ring-attention", 3);
  ring.as<planner::ZeroParams>().cp = 4;
  ring.as<planner::ZeroParams>().zigzag = true;
  ring.as<planner::ZeroParams>().activation_checkpointing = true;
  ring.as<planner::ZeroParams>().checkpoint_every = 2;
  const EngineLaunch l = planner::export_plan(rig.in(), ring, "torchtitan");
  expect_known_options(l, names);
  const auto keys = toml_keys(file_text(l, "train.toml"));
  for (const auto& [key, value] : keys) EXPECT_TRUE(names.count(key)) << key << " is not a key of the targeted torchtitan";
  EXPECT_EQ(keys.at("parallelism.context_parallel_degree"), "4");
  EXPECT_EQ(keys.at("parallelism.data_parallel_shard_degree"), "4");  // FSDP over the 16 GPUs' dp x cp
  EXPECT_EQ(keys.at("parallelism.context_parallel_rotate_method"), "\"alltoall\"");
  EXPECT_EQ(keys.at("activation_checkpoint.mode"), "\"selective\"");
  EXPECT_EQ(keys.at("activation_checkpoint.selective_ac_option"), "\"2\"");
  EXPECT_EQ(keys.at("model.flavor"), "\"8B\"");

  Rig fp32 = rig;  // torchtitan trains TP and PP without FSDP in fp32 only
  fp32.precision = model::precision_policy("fp32");
  const EngineLaunch tp = planner::export_plan(fp32.in(), megatron(8, 2, 1), "torchtitan");
  const auto tp_keys = toml_keys(file_text(tp, "train.toml"));
  EXPECT_EQ(tp_keys.at("parallelism.tensor_parallel_degree"), "8");
  EXPECT_EQ(tp_keys.at("parallelism.pipeline_parallel_layers_per_stage"), "16");
  // torchtitan's stage count: (32 layers + first and last "less layers") / 16 must be pp: both written as 0.
  EXPECT_EQ(tp_keys.at("parallelism.pipeline_parallel_first_stage_less_layers"), "0");
  EXPECT_EQ(tp_keys.at("parallelism.pipeline_parallel_last_stage_less_layers"), "0");
  EXPECT_EQ(tp_keys.at("training.local_batch_size"), "16");  // every micro-batch of the step in one pipeline schedule

  const auto refusal = [&](const Rig& r, const PlanSpec& spec) { return test::error_of([&] { planner::export_plan(r.in(), spec, "torchtitan"); }); };
  EXPECT_NE(refusal(rig, megatron(8, 1, 2)).find("'dp'"), std::string::npos);       // DDP only alone
  EXPECT_NE(refusal(rig, megatron(8, 2, 1)).find("precision"), std::string::npos);  // bf16 with TP, no FSDP: fp32 there
  Rig bf16 = rig;
  bf16.precision = model::precision_policy("bf16-mixed");
  EXPECT_NE(refusal(bf16, ring).find("precision"), std::string::npos);
  Rig small = rig;
  small.model = model::load_model("llama3.2-1b");
  const std::string no_flavor = refusal(small, ring);
  EXPECT_NE(no_flavor.find("'model'"), std::string::npos) << no_flavor;
  EXPECT_NE(no_flavor.find("torchtitan"), std::string::npos) << no_flavor;
}

TEST(Export, EverySchemeNamesEnginesThatExistAndRingTrackHasNone) {
  const Rig rig = llama8b();
  for (const auto& name : planner::scheme_names()) {
    for (const auto& [engine, writer] : planner::scheme_named(name).exports) {
      EXPECT_NO_THROW(planner::engine_named(engine)) << name;
      EXPECT_NE(writer, nullptr);
    }
  }
  EXPECT_TRUE(planner::scheme_named("ringtrack").exports.empty());
  PlanSpec ring = planner::scheme_named("ringtrack").blank();
  ring.as<planner::RingTrackParams>().ring = 8;
  for (const auto& engine : planner::engines()) {
    const std::string refused = test::error_of([&] { planner::export_plan(rig.in(), ring, engine.name); });
    EXPECT_NE(refused.find("ringtrack"), std::string::npos) << refused;
  }
  EXPECT_NE(test::error_of([] { planner::engine_named("nemo"); }).find("--to"), std::string::npos);
}

// The launch script is bash that parses (bash -n), launches on every node, and reads the user's variables.
TEST(Export, TheLaunchScriptIsBashThatLaunchesEveryNode) {
  const Rig rig = llama8b(2);
  PlanSpec ulysses = zero_family("ulysses", 2);
  ulysses.as<planner::ZeroParams>().sp = 8;
  const EngineLaunch l = planner::export_plan(rig.in(), ulysses, "deepspeed");
  const std::string script = planner::launch_script(l, rig.cluster);
  EXPECT_NE(script.find("--num_nodes 2 --num_gpus 8"), std::string::npos) << script;
  EXPECT_NE(script.find("--hostfile \"$HOSTFILE\""), std::string::npos) << script;
  EXPECT_NE(script.find("if [ -z \"${DATA_PATH:-}\" ]"), std::string::npos) << script;
  EXPECT_NE(script.find("--deepspeed_config \"$HERE/ds_config.json\""), std::string::npos) << script;
  const test::TempDir dir;
  const std::string path = dir.write("launch.sh", script);
  EXPECT_EQ(std::system(("bash -n " + path).c_str()), 0) << script;
  const std::string torchrun = planner::launch_script(planner::export_plan(rig.in(), megatron(8, 2, 1), "megatron"), rig.cluster);
  EXPECT_NE(torchrun.find("torchrun --nnodes 2 --nproc_per_node 8"), std::string::npos) << torchrun;
  EXPECT_EQ(std::system(("bash -n " + dir.write("megatron.sh", torchrun)).c_str()), 0);
}

}  // namespace
}  // namespace trainyard
