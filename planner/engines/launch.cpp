#include "planner/engines/launch.hpp"

#include <charconv>
#include <cmath>
#include <sstream>

#include "common/error.hpp"
#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

const std::vector<Engine>& engines() {
  static const std::vector<Engine> all = {
      // Megatron-LM and DeepSpeed under --bf16 reduce bf16 gradients unless told otherwise; torchtitan's FSDP
      // reduces them in fp32 (training.mixed_precision_reduce, "float32" its only value: torchtitan.cpp).
      {"megatron", "Megatron-LM pretrain_gpt.py under torchrun", "NVIDIA/Megatron-LM d98e8a64 (2026-08-22, after core_v0.16.1)", "bf16-mixed"},
      {"deepspeed", "Megatron-DeepSpeed pretrain_gpt.py under the deepspeed launcher, with a DeepSpeed config",
       "deepspeedai/Megatron-DeepSpeed 4efb479d (2025-07-16), deepspeedai/DeepSpeed 0.19.6 (edaa7221)", "bf16-mixed"},
      {"torchtitan", "torchtitan's train.py under torchrun, with a TOML job config", "pytorch/torchtitan v0.2.2 (73a0e697; the last TOML release)",
       "bf16-mixed-fp32-grads"},
  };
  return all;
}

const Engine& engine_named(const std::string& name) {
  std::string names;
  for (const Engine& e : engines()) {
    if (e.name == name) return e;
    names += (names.empty() ? "" : ", ") + e.name;
  }
  throw InputError("--to", "value", "one of " + names, "\"" + name + "\"");
}

void EngineLaunch::add(std::string option, std::vector<std::string> values) {
  values.insert(values.begin(), std::move(option));
  args.push_back(std::move(values));
}

void refuse_export(const Engine& engine, const std::string& parameter, const std::string& expected, const std::string& found) {
  throw InputError("export to " + engine.name + " (" + engine.version + ")", parameter, expected, found);
}

EngineLaunch export_plan(const StepInputs& in, const PlanSpec& spec, const std::string& engine) {
  const Engine& e = engine_named(engine);
  const Scheme& scheme = scheme_named(spec.scheme);
  std::string offered;
  for (const auto& [name, writer] : scheme.exports) {
    if (name == e.name) {
      check_plan(in, spec);
      return writer(in, spec);
    }
    offered += (offered.empty() ? "" : ", ") + name;
  }
  refuse_export(e, "scheme",
                offered.empty() ? "a scheme " + e.name + " runs (" + spec.scheme + " has no equivalent on any engine)"
                                : "a scheme " + e.name + " runs (" + spec.scheme + " exports to " + offered + ")",
                spec.scheme);
}

namespace {

// Single-quoted for bash unless plainly safe.
std::string shell_word(const std::string& word) {
  if (word.size() > 1 && word[0] == '$') return "\"" + word + "\"";  // a variable the user sets (EngineLaunch::inputs)
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,/=:+") == std::string::npos)
    return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The script's check that the user set `name` (to `what`).
void require_variable(std::ostream& out, const std::string& name, const std::string& what) {
  out << "if [ -z \"${" << name << ":-}\" ]; then echo " << shell_word("set " + name + " to " + what) << " >&2; exit 2; fi\n";
}

}  // namespace

std::string launch_script(const EngineLaunch& launch, const sim::Cluster& cluster) {
  const Engine& e = engine_named(launch.engine);
  const int nodes = cluster.topology.node_count(), per_node = cluster.topology.gpus_per_node();
  std::ostringstream out;
  out << "#!/usr/bin/env bash\n"
      << "# Written by `trainyard export --to " << e.name << "`: " << e.program << ", options of " << e.version << ".\n"
      << "# " << nodes << " node" << (nodes == 1 ? "" : "s") << " of " << per_node << " GPUs: run this on every node with NODE_RANK set (0 .. "
      << nodes - 1 << ") and MASTER_ADDR naming node 0.\n";
  for (const std::string& note : launch.notes) out << "# " << note << "\n";
  out << "set -euo pipefail\nHERE=$(cd \"$(dirname \"$0\")\" && pwd)  # the files written beside this script\n";
  for (const auto& [name, what] : launch.inputs) require_variable(out, name, what);
  for (const auto& [name, value] : launch.env) out << "export " << name << "=" << shell_word(value) << "\n";
  out << "NODE_RANK=${NODE_RANK:-0}\nMASTER_ADDR=${MASTER_ADDR:-localhost}\nMASTER_PORT=${MASTER_PORT:-6000}\n";
  if (launch.launcher == "deepspeed" && nodes == 1) {
    out << "deepspeed --num_gpus " << per_node << " --master_port \"$MASTER_PORT\" " << launch.program;
  } else if (launch.launcher == "deepspeed") {
    // Several nodes: each node launches its own ranks (--no_ssh), the node list in a hostfile ("name slots=GPUS").
    require_variable(out, "HOSTFILE", "a DeepSpeed hostfile: one line per node, NAME slots=" + std::to_string(per_node));
    out << "deepspeed --hostfile \"$HOSTFILE\" --no_ssh --node_rank \"$NODE_RANK\" --master_addr \"$MASTER_ADDR\" --master_port \"$MASTER_PORT\""
        << " --num_nodes " << nodes << " --num_gpus " << per_node << " " << launch.program;
  } else {
    out << launch.launcher << " --nnodes " << nodes << " --nproc_per_node " << per_node
        << " --node_rank \"$NODE_RANK\" --master_addr \"$MASTER_ADDR\" --master_port \"$MASTER_PORT\" " << launch.program;
  }
  for (const auto& arg : launch.args) {
    out << " \\\n    ";
    for (std::size_t i = 0; i < arg.size(); ++i) out << (i ? " " : "") << shell_word(arg[i]);
  }
  out << "\n";
  return out.str();
}

std::string engine_number(double value) {
  if (std::isfinite(value) && value == std::floor(value) && std::abs(value) < 1e15) return std::to_string(static_cast<long long>(value));
  char text[64];
  const auto written = std::to_chars(text, text + sizeof text, value);  // the shortest text that reads back the same
  return std::string(text, written.ptr);
}

void add_megatron_shape(const StepInputs& in, EngineLaunch& l) {
  const model::ModelConfig& m = in.model;
  l.add("--num-layers", {engine_number(m.layers)});
  l.add("--hidden-size", {engine_number(m.hidden)});
  l.add("--ffn-hidden-size", {engine_number(m.ffn_hidden)});
  l.add("--num-attention-heads", {engine_number(m.heads)});
  if (m.head_dim * m.heads != m.hidden) l.add("--kv-channels", {engine_number(m.head_dim)});
  if (m.activation == model::Activation::swiglu) l.add("--swiglu");
  if (!m.bias) l.add("--disable-bias-linear");
  if (!m.tied_embeddings) l.add("--untie-embeddings-and-output-weights");
  l.add("--tokenizer-type", {"NullTokenizer"});
  l.add("--vocab-size", {engine_number(m.vocab)});
  l.add("--seq-length", {engine_number(in.workload.seq_len)});
  l.add("--max-position-embeddings", {engine_number(in.workload.seq_len)});
}

}  // namespace trainyard::planner
