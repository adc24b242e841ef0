#include "planner/lengths.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <set>
#include <sstream>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/json_reader.hpp"
#include "common/units.hpp"

namespace trainyard::planner {

namespace {

// The built-in fits. Seed 004 (HotSPa) shows the two datasets' length CDFs only as a figure, but its Table 3
// gives the time a static strategy (32B, 32 GPUs, s = 32K) spends on each length group: 0-1K, 1-4K, 4-8K, 8-16K,
// 16-32K = 42.1, 12.5, 3.5, 2.9, 2.4 s (CommonCrawl) and 34.9, 38.4, 25.0, 27.3, 53.0 s (GitHub). Taking those as
// the groups' token shares (time per token grows with length through attention, so the long groups' shares are
// slightly overstated), (mu, sigma) minimise the squared log error of the lognormal's token shares, documents over
// 32K counted in the top group: scripts/fit_length_dists.py reproduces the fit and prints both rows of shares.
struct BuiltinFit {
  const char* name;
  double mu, sigma;
};
constexpr BuiltinFit kBuiltins[] = {{"commoncrawl", 2.06, 2.02}, {"github", 4.85, 1.96}};

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : engine_(seed) {}
  // [0, 1) from the top 53 bits: std::mt19937_64's sequence is fixed by the standard, this transform is ours.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  double normal() {                     // Box-Muller, one of the pair
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  std::size_t index(std::size_t n) { return std::min(n - 1, static_cast<std::size_t>(uniform() * static_cast<double>(n))); }

 private:
  std::mt19937_64 engine_;
};

std::int64_t draw(const LengthSource& s, Generator& gen) {
  switch (s.kind) {
    case LengthSource::Kind::lognormal: return static_cast<std::int64_t>(std::llround(std::exp(s.mu + s.sigma * gen.normal())));
    case LengthSource::Kind::samples: return s.samples[gen.index(s.samples.size())];
    case LengthSource::Kind::histogram: {
      double total = 0;
      for (const auto& b : s.bins) total += b.weight;
      double pick = gen.uniform() * total;
      const LengthSource::Bin* bin = &s.bins.back();
      for (const auto& b : s.bins) {
        if (pick < b.weight) {
          bin = &b;
          break;
        }
        pick -= b.weight;
      }
      const double lo = std::log(static_cast<double>(bin->min)), hi = std::log(static_cast<double>(bin->max) + 1);
      return std::clamp<std::int64_t>(static_cast<std::int64_t>(std::exp(lo + (hi - lo) * gen.uniform())), bin->min, bin->max);
    }
  }
  return 1;
}

LengthSource read_histogram(const std::string& path) {
  const json::Json doc = json::parse_file(path);
  const json::Reader r(doc, path);
  r.expect_string("schema", "trainyard.lengths.v1");
  LengthSource s;
  s.kind = LengthSource::Kind::histogram;
  s.origin = path;
  if (r.has("description")) s.description = r.string("description");
  for (const auto& bin : r.objects("bins")) {
    LengthSource::Bin b;
    b.min = bin.integer("min", 1, std::int64_t{1} << 40);
    b.max = bin.integer("max", b.min, std::int64_t{1} << 40);
    b.weight = bin.number("weight", {0, 1e300, "", false, false});
    bin.finish();
    s.bins.push_back(b);
  }
  r.finish();
  double total = 0;
  for (const auto& b : s.bins) total += b.weight;
  if (!(total > 0)) throw InputError(path, "bins", "at least one bin with a positive weight", "all weights 0");
  if (s.description.empty()) s.description = "histogram of " + std::to_string(s.bins.size()) + " bins from " + path;
  return s;
}

LengthSource read_samples(const std::string& path) {
  std::istringstream in(read_input_file(path, kTextFileCapBytes, "a text file of sequence lengths, one per line"));
  LengthSource s;
  s.kind = LengthSource::Kind::samples;
  s.origin = path;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;  // blank lines and comments
    const auto last = line.find_last_not_of(" \t\r");
    const std::string item = line.substr(first, last - first + 1);
    const std::string where = path + ":" + std::to_string(number);
    if (item.find_first_not_of("0123456789") != std::string::npos || item.size() > 12) {
      throw InputError(where, "length", "a positive integer number of tokens", "\"" + item + "\"");
    }
    const std::int64_t v = std::stoll(item);
    if (v < 1) throw InputError(where, "length", "a positive integer number of tokens", item);
    s.samples.push_back(v);
  }
  if (s.samples.empty()) throw InputError(path, "file", "at least one sequence length", "no lengths");
  s.description = std::to_string(s.samples.size()) + " observed lengths from " + path + ", sampled with replacement";
  return s;
}

}  // namespace

std::vector<std::string> builtin_length_sources() {
  std::vector<std::string> names;
  for (const auto& b : kBuiltins) names.push_back(std::string("dist:") + b.name);
  return names;
}

LengthSource load_lengths(const std::string& spec) {
  if (spec.starts_with("dist:")) {
    for (const auto& b : kBuiltins) {
      if (spec == std::string("dist:") + b.name) {
        LengthSource s;
        s.origin = spec;
        s.mu = b.mu;
        s.sigma = b.sigma;
        s.description = "lognormal(mu " + format_fixed(b.mu, 2) + ", sigma " + format_fixed(b.sigma, 2) +
                        ") tokens per document, fitted to the token shares per length group of seed 004's Table 3 "
                        "(static column)";
        return s;
      }
    }
    std::string known;
    for (const auto& n : builtin_length_sources()) known += (known.empty() ? "" : ", ") + n;
    throw InputError("--lengths", "value", "one of " + known + " or a file", "\"" + spec + "\"");
  }
  if (spec.ends_with(".json")) return read_histogram(spec);
  return read_samples(spec);
}

std::vector<std::int64_t> sample_minibatch(const LengthSource& source, std::int64_t tokens, std::int64_t max_len, std::uint64_t seed) {
  if (tokens < 1) throw InputError("--tokens-per-step", "value", "a positive number of tokens", std::to_string(tokens));
  if (max_len < 1) throw InputError("--max-len", "value", "a positive number of tokens", std::to_string(max_len));
  Generator gen(seed);
  std::vector<std::int64_t> lengths;
  std::int64_t left = tokens;
  int redraws = 0;
  while (left > 0) {
    std::int64_t doc = draw(source, gen);
    if (doc < kMinDocumentTokens && source.kind == LengthSource::Kind::lognormal) {
      if (++redraws > 1'000'000) throw InputError(source.origin, "lengths", "documents of at least 16 tokens", "none drawn");
      continue;
    }
    doc = std::min(std::max<std::int64_t>(doc, 1), left);
    left -= doc;
    for (; doc > max_len; doc -= max_len) lengths.push_back(max_len);
    lengths.push_back(doc);
  }
  return lengths;
}

std::int64_t LengthGroup::tokens() const {
  std::int64_t t = 0;
  for (auto l : lengths) t += l;
  return t;
}

std::vector<LengthGroup> group_lengths(const std::vector<std::int64_t>& lengths, const std::vector<std::int64_t>& upper_bounds) {
  if (upper_bounds.empty()) throw InputError("--groups", "value", "at least one length group", "none");
  for (std::size_t i = 0; i < upper_bounds.size(); ++i) {
    if (upper_bounds[i] < 1 || (i > 0 && upper_bounds[i] <= upper_bounds[i - 1])) {
      throw InputError("--groups", "value", "ascending positive group bounds",
                       format_tokens(upper_bounds[i]) + " at position " + std::to_string(i + 1));
    }
  }
  std::vector<LengthGroup> groups(upper_bounds.size());
  for (std::size_t i = 0; i < groups.size(); ++i) {
    groups[i].lo = i == 0 ? 0 : upper_bounds[i - 1];
    groups[i].hi = upper_bounds[i];
  }
  for (auto l : lengths) {
    const auto it = std::lower_bound(upper_bounds.begin(), upper_bounds.end(), l);
    if (it == upper_bounds.end()) {
      throw InputError("--groups", "value", "a last group bound of at least the longest sequence (" + format_tokens(l) + ")",
                       format_tokens(upper_bounds.back()));
    }
    groups[it - upper_bounds.begin()].lengths.push_back(l);
  }
  for (auto& g : groups) std::sort(g.lengths.begin(), g.lengths.end(), std::greater<>());
  return groups;
}

Batching parse_batching(const std::string& text) {
  if (text == "packing") return Batching::packing;
  if (text == "padding") return Batching::padding;
  throw InputError("--batching", "value", "packing or padding", "\"" + text + "\"");
}

std::string_view to_string(Batching b) { return b == Batching::packing ? "packing" : "padding"; }

GroupRows group_rows(const LengthGroup& group, Batching batching, std::int64_t row_multiple) {
  TRAINYARD_CHECK(row_multiple >= 1, "row multiple below 1");
  GroupRows rows;
  rows.sequences = static_cast<std::int64_t>(group.lengths.size());
  const std::int64_t row_len = group.hi;
  std::int64_t count = 0;
  if (batching == Batching::padding) {
    count = rows.sequences;
  } else {
    // Best-fit decreasing: each sequence (longest first) goes to the fullest row it fits in.
    std::multiset<std::int64_t> room;
    for (auto l : group.lengths) {
      auto it = room.lower_bound(l);
      if (it == room.end()) {
        room.insert(row_len - l);
      } else {
        const std::int64_t left = *it - l;
        room.erase(it);
        room.insert(left);
      }
    }
    count = static_cast<std::int64_t>(room.size());
  }
  count = std::max<std::int64_t>(count, 1);
  count = (count + row_multiple - 1) / row_multiple * row_multiple;
  rows.workload = {row_len, count};
  const double row_tokens = static_cast<double>(row_len) * static_cast<double>(count);
  rows.fill = static_cast<double>(group.tokens()) / row_tokens;
  if (batching == Batching::packing) {
    double squares = 0;
    for (auto l : group.lengths) squares += static_cast<double>(l) * static_cast<double>(l);
    rows.attention_density = squares / (row_tokens * static_cast<double>(row_len));
  }
  return rows;
}

}  // namespace trainyard::planner
