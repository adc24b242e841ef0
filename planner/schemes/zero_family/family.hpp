#pragma once
// What the ZeRO family (zero, ulysses, ring-attention, fpdt: zero.hpp builds them all) shares: its parameters
// (ZeroParams), their plan-file fields, and the variants the search tries on top of each scheme's split.
#include <string>

#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

// "zero-2" + `split` (e.g. ", sp 4") + micro-batch, checkpointing and offload.
std::string zero_family_summary(const ZeroParams& z, const std::string& split);
// The family's flags (zero-stage, sp, cp, zigzag, micro-batch, recompute as checkpointing, offload).
PlanSpec zero_family_from_flags(const FlagValues& flags);
// Every ZeRO stage with its offload sets, with and without activation checkpointing (always with it when
// `require_ac`) and checkpoint offload, at each searched micro-batch, on top of `base`'s split.
void zero_family_variants(const std::string& scheme, const ZeroParams& base, bool require_ac, const AddPlan& add);
// The entry's fields every member of the family has alike; each member names itself, its split and its search.
Scheme zero_family_scheme(std::string name, std::string description, std::vector<std::string> split_flags);
// RunFacet::refusal of the ZeRO-family schemes the executors run (their builders annotate every task): a
// micro-batch of at most 255 sequences, and of one with Ulysses, ring attention or FPDT.
std::string zero_family_run_refusal(const StepInputs& in, const PlanSpec& spec, int ranks);

}  // namespace trainyard::planner
