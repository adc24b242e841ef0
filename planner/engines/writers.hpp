#pragma once
// The writers of `trainyard export` (planner/engines/launch.hpp), one per engine and parameter family; the scheme
// registry's entries name them (Scheme::exports). Each throws (refuse_export) for what its engine cannot express.
#include "planner/engines/launch.hpp"

namespace trainyard::planner {

// Megatron-LM's pretrain_gpt.py: the megatron scheme.
EngineLaunch megatron_lm_launch(const StepInputs& in, const PlanSpec& spec);
// Megatron-DeepSpeed with a DeepSpeed config: the ZeRO family's zero, ulysses and fpdt.
EngineLaunch deepspeed_launch(const StepInputs& in, const PlanSpec& spec);
// torchtitan: the megatron scheme (TP, PP, DP, CP) and the ZeRO family's zero and ring-attention (FSDP, CP).
EngineLaunch torchtitan_megatron_launch(const StepInputs& in, const PlanSpec& spec);
EngineLaunch torchtitan_zero_launch(const StepInputs& in, const PlanSpec& spec);

}  // namespace trainyard::planner
