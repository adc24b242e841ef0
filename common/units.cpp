#include "common/units.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/error.hpp"

namespace trainyard {

std::int64_t parse_token_count(std::string_view text, const std::string& origin) {
  const std::string expected = "a token count such as 4096, 32K or 1M (K = 1024, M = 1048576, G = 2^30)";
  if (text.empty()) throw InputError(origin, "value", expected, "an empty string");
  double scale = 1;
  std::string_view digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      scale = 1024.0;
      digits.remove_suffix(1);
      break;
    case 'M':
    case 'm':
      scale = 1048576.0;
      digits.remove_suffix(1);
      break;
    case 'G':
    case 'g':
      scale = 1073741824.0;
      digits.remove_suffix(1);
      break;
    default: break;
  }
  double value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  const double tokens = value * scale;
  if (ec != std::errc() || end != digits.data() + digits.size() || !(tokens >= 1) || tokens > 9.0e15 || std::floor(tokens) != tokens) {
    throw InputError(origin, "value", expected, "\"" + std::string(text) + "\"");
  }
  return static_cast<std::int64_t>(tokens);
}

std::string format_number(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", value);
  return buf;
}

std::string format_seconds(double seconds) {
  // Three significant figures in the largest unit that keeps the number at least 1 (whole seconds from 100 s).
  const auto figures = [](double v, const char* unit) { return format_fixed(v, v >= 100 ? 0 : v >= 10 ? 1 : 2) + unit; };
  if (seconds >= 1 || seconds == 0) return figures(seconds, " s");
  if (seconds >= 1e-3) return figures(seconds * 1e3, " ms");
  return figures(seconds * 1e6, " us");
}

std::string format_fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

namespace {
std::string scaled(double value, double base, const char* const* units, int count) {
  int i = 0;
  while (i + 1 < count && std::fabs(value) >= base) {
    value /= base;
    ++i;
  }
  char buf[64];
  if (i == 0) {
    std::snprintf(buf, sizeof buf, "%.0f %s", value, units[0]);
  } else {
    std::snprintf(buf, sizeof buf, "%.*f %s", std::fabs(value) < 10 ? 2 : 1, value, units[i]);
  }
  return buf;
}
}  // namespace

std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  return scaled(bytes, 1024.0, units, 6);
}

std::string format_count(double count) {
  static const char* const units[] = {"", "K", "M", "B", "T"};
  std::string out = scaled(count, 1000.0, units, 5);
  if (out.back() == ' ') out.pop_back();
  return out;
}

std::string format_tokens(std::int64_t tokens) {
  if (tokens >= 1048576 && tokens % 1048576 == 0) return std::to_string(tokens / 1048576) + "M";
  if (tokens >= 1024 && tokens % 1024 == 0) return std::to_string(tokens / 1024) + "K";
  return std::to_string(tokens);
}

std::string format_flops(double flops) {
  static const char* const units[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
  return scaled(flops, 1000.0, units, 7);
}

std::vector<std::string> split_commas(std::string_view text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    out.emplace_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

}  // namespace trainyard
