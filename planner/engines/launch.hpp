#pragma once
// `trainyard export --to ENGINE`: a plan as the launch configuration of a training engine users already run, so
// that they can run trainyard's plan on it and bring its profiler trace back to `trainyard compare`. Each scheme's
// registry entry lists the engines it exports to (Scheme::exports) and the writer for each (planner/engines/*.cpp);
// what an engine cannot express is refused, naming the plan's parameter and the engine.
//
// The option names were looked up in the engines' repositories at the versions `engines()` gives, and the tests hold
// every option written to those lists (tests/data/engines/).
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "planner/plan.hpp"

namespace trainyard::planner {

struct Engine {
  std::string name;     // --to's value: "megatron", "deepspeed", "torchtitan"
  std::string program;  // what runs: "Megatron-LM pretrain_gpt.py"
  std::string version;  // the version whose option names the writer uses
  // The precision policy (models/precision.hpp) its runs take unless told otherwise: `plan --engine`'s default, so
  // the plan it writes exports as it is.
  std::string precision;
};
const std::vector<Engine>& engines();
const Engine& engine_named(const std::string& name);  // InputError (--to) for another name

// One launch: the environment, the launcher and program, its arguments, and the files it reads.
struct EngineLaunch {
  std::string engine;                                    // Engine::name
  std::vector<std::pair<std::string, std::string>> env;  // exported before the launch: CUDA_DEVICE_MAX_CONNECTIONS=1
  std::string launcher;                                  // "torchrun" or "deepspeed"
  std::string program;                                   // "pretrain_gpt.py", "-m torchtitan.train"
  std::vector<std::vector<std::string>> args;            // each an option and its values: {"--tensor-model-parallel-size", "2"}
  struct File {
    std::string name, text;
  };
  std::vector<File> files;         // written beside the launch script (ds_config.json, train.toml)
  std::vector<std::string> notes;  // what the user should know (data, tokenizer, where traces go)
  // Variables the user must set before launching, and what each is; an argument "$NAME" reads one.
  std::vector<std::pair<std::string, std::string>> inputs;
  void add(std::string option, std::vector<std::string> values = {});
};

// Throws the InputError `trainyard export` reports: `parameter` is the plan's ("tp_comm_overlap", "model"),
// `expected` what the engine has.
[[noreturn]] void refuse_export(const Engine& engine, const std::string& parameter, const std::string& expected, const std::string& found);

// The plan's launch on `engine` (through the scheme's registry entry); InputError when the scheme has no writer for
// it or the engine cannot express one of the plan's parameters.
EngineLaunch export_plan(const StepInputs& in, const PlanSpec& spec, const std::string& engine);

// A bash script that sets the environment and launches on every node of `cluster` (NODE_RANK, MASTER_ADDR and
// MASTER_PORT from the environment, as torchrun's multi-node launch wants them), with the notes as comments.
std::string launch_script(const EngineLaunch& launch, const sim::Cluster& cluster);

// Shared by the writers: a number as an engine reads it ("500000", "1e-05").
std::string engine_number(double value);
template <typename Integer>
requires std::is_integral_v<Integer> std::string engine_number(Integer value) { return std::to_string(value); }
// The options Megatron-LM and Megatron-DeepSpeed spell alike (the model's sizes, SwiGLU, biases, untied output,
// NullTokenizer's vocabulary, the sequence); each writer adds those they spell apart (GQA, norms, RoPE).
void add_megatron_shape(const StepInputs& in, EngineLaunch& launch);

}  // namespace trainyard::planner
