#pragma once
// The numeric formats a GPU's peak rates are given for and tasks compute in (no JSON: sim/task_graph.hpp uses it).
#include <array>
#include <string_view>

namespace trainyard::hw {

enum class Dtype { bf16, fp16, tf32, fp32 };
inline constexpr std::array<Dtype, 4> kAllDtypes = {Dtype::bf16, Dtype::fp16, Dtype::tf32, Dtype::fp32};
std::string_view to_string(Dtype dtype);

}  // namespace trainyard::hw
