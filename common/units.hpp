#pragma once
// Parsing and printing of quantities. Token counts use binary suffixes (1K = 1024, 1M = 1048576), as the
// long-context literature does (a "128K" context is 131072 tokens); bandwidths are decimal (1 GB/s = 1e9 B/s).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard {

// "4096", "32K", "1M", "1.5M" -> tokens. Throws InputError naming `origin` on anything else.
std::int64_t parse_token_count(std::string_view text, const std::string& origin);
// "a,b,c" -> {"a", "b", "c"} (empty items kept, so that callers can reject them).
std::vector<std::string> split_commas(std::string_view text);

std::string format_number(double value);  // 12, 0.5, 8.03e+09 -> short, exact where it can be
std::string format_fixed(double value, int decimals);
std::string format_bytes(double bytes);          // binary units: "80.0 GiB", "2.00 TiB"
std::string format_count(double count);          // decimal: "8.03 B", "525.3 M", "4096"
std::string format_tokens(std::int64_t tokens);  // binary: "1M", "256K", "5000"
std::string format_flops(double flops);          // "1.23 PFLOP", "48.2 GFLOP"
std::string format_seconds(double seconds);      // three figures at most: "680 s", "20.6 s", "1.25 s", "413 ms", "87.5 us"

}  // namespace trainyard
