#pragma once
// How much memory a command may use for what it builds (task graphs, simulation state, tensors): by default
// half of the machine's available memory (/proc/meminfo MemAvailable), capped at kDefaultBudgetCapBytes so that
// no input drives a command much past 2 GiB; --memory-budget raises (or lowers) it.
#include <cstdint>
#include <string>

namespace trainyard {

inline constexpr std::int64_t kDefaultBudgetCapBytes = std::int64_t{1536} << 20;  // leaves room for the rest under 2 GiB

// MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read.
std::int64_t available_memory_bytes();
std::int64_t default_memory_budget_bytes();
// "8G", "512M", "1.5G", "4096" (bytes; K, M, G, T binary); InputError naming `flag` otherwise.
std::int64_t parse_memory_size(const std::string& text, const std::string& flag);

}  // namespace trainyard
