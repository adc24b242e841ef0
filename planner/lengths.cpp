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

// The built-in fits: lognormal tokens per document, fitted to seed 004's Table 3 as HotSPa's artifact ran it
// (docs/hotspa_notes.md, "Lengths"). A mini-batch is 512 documents cut at 32K + 1 tokens; under the static plan
// (DP 1, TP 16, PP 2, one 32K bucket, rows padded) every row costs the same, so the static totals (63.4 s
// CommonCrawl, 178.6 s GitHub) give the rows 512 documents fill: (static_s - fixed_s) / row_s with trainyard's own
// simulation of full rows (2.13 s + 2.118 s a row: 28.9 and 83.3 rows). mu is set so that first-fit decreasing
// packing of 512 draws fills that many rows on average; sigma, along that curve, best matches the static column's
// time shares per length group read as token shares (they cannot all be met: 66% of CommonCrawl's time is in
// documents up to 1K). scripts/fit_length_dists.py reproduces the fit; the static rows are calibration, not checks.
struct BuiltinFit {
  const char* name;
  double mu, sigma;
};
constexpr BuiltinFit kBuiltins[] = {{"commoncrawl", 7.01, 1.00}, {"github", 7.59, 1.60}};

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
                        ") tokens per document, fitted so that 512 documents fill the rows of seed 004's Table 3 static time "
                        "(scripts/fit_length_dists.py)";
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

std::vector<std::int64_t> sample_documents(const LengthSource& source, std::int64_t documents, std::int64_t max_len, std::uint64_t seed) {
  if (documents < 1) throw InputError("--batch-sequences", "value", "a positive number of documents", std::to_string(documents));
  if (max_len < 1) throw InputError("--max-len", "value", "a positive number of tokens", std::to_string(max_len));
  Generator gen(seed);
  std::vector<std::int64_t> positions;
  positions.reserve(static_cast<std::size_t>(documents));
  int redraws = 0;
  while (static_cast<std::int64_t>(positions.size()) < documents) {
    const std::int64_t doc = draw(source, gen);
    // Near-empty documents are redrawn, as sample_minibatch does; a document must train on one position at least.
    const std::int64_t shortest = source.kind == LengthSource::Kind::lognormal ? kMinDocumentTokens : kLabelShiftTokens + 1;
    if (doc < shortest) {
      if (++redraws > 1'000'000)
        throw InputError(source.origin, "lengths", "documents of at least " + std::to_string(shortest) + " tokens", "none drawn");
      continue;
    }
    positions.push_back(std::min(doc, max_len + kLabelShiftTokens) - kLabelShiftTokens);
  }
  return positions;
}

namespace {

// The rows' free room as a max-tree over `rows` leaves, each starting at `capacity`: rows not yet opened have
// the full room, so the first row with room for an item is an open one or the next to open.
class RowRoom {
 public:
  RowRoom(std::size_t rows, std::int64_t capacity) {
    while (leaves_ < rows) leaves_ *= 2;
    room_.assign(2 * leaves_, capacity);
  }
  // The first row with at least `need` free (the caller knows one exists).
  std::size_t first_with(std::int64_t need) const {
    std::size_t node = 1;
    while (node < leaves_) node = room_[2 * node] >= need ? 2 * node : 2 * node + 1;
    return node - leaves_;
  }
  void take(std::size_t row, std::int64_t amount) {
    std::size_t node = row + leaves_;
    room_[node] -= amount;
    for (node /= 2; node >= 1; node /= 2) room_[node] = std::max(room_[2 * node], room_[2 * node + 1]);
  }

 private:
  std::size_t leaves_ = 1;
  std::vector<std::int64_t> room_;
};

}  // namespace

std::vector<std::vector<std::int64_t>> first_fit_decreasing(std::vector<std::int64_t> items, std::int64_t capacity) {
  std::sort(items.begin(), items.end(), std::greater<>());
  std::vector<std::vector<std::int64_t>> rows;
  if (items.empty()) return rows;
  if (items.front() > capacity) {
    throw InputError("packing", "item", "items of at most the row's " + std::to_string(capacity) + " tokens", std::to_string(items.front()));
  }
  RowRoom room(items.size(), capacity);
  for (const std::int64_t item : items) {
    const std::size_t row = room.first_with(item);
    if (row == rows.size()) rows.emplace_back();
    rows[row].push_back(item);
    room.take(row, item);
  }
  return rows;
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
  if (text == "ffd-padded") return Batching::ffd_padded;
  throw InputError("--batching", "value", "packing, padding or ffd-padded", "\"" + text + "\"");
}

std::string_view to_string(Batching b) {
  switch (b) {
    case Batching::packing: return "packing";
    case Batching::padding: return "padding";
    case Batching::ffd_padded: return "ffd-padded";
  }
  return "packing";
}

namespace {

// Best-fit decreasing: each sequence (longest first) goes to the fullest row it fits in. The number of rows.
std::int64_t best_fit_rows(const LengthGroup& group, std::int64_t row_len) {
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
  return static_cast<std::int64_t>(room.size());
}

// HotSPa's artifact: first-fit decreasing into padded rows, the rows past a multiple of `row_multiple` dropped (their
// documents not trained on), a group left without rows run as `row_multiple` dummy rows.
GroupRows ffd_padded_rows(const LengthGroup& group, std::int64_t row_len, std::int64_t row_multiple) {
  GroupRows rows;
  rows.sequences = static_cast<std::int64_t>(group.lengths.size());
  std::vector<std::int64_t> tokens;  // each document's positions and its label
  tokens.reserve(group.lengths.size());
  for (auto l : group.lengths) tokens.push_back(l + kLabelShiftTokens);
  const auto packed = first_fit_decreasing(std::move(tokens), row_len + kLabelShiftTokens);
  rows.packed_rows = static_cast<std::int64_t>(packed.size());
  const std::int64_t kept = rows.packed_rows / row_multiple * row_multiple;
  rows.dropped_rows = rows.packed_rows - kept;
  if (kept == 0) {
    rows.workload = {kDummyRowTokens, row_multiple};
    rows.fill = 0;
    return rows;
  }
  rows.workload = {row_len, kept};
  double trained = 0;
  for (std::int64_t r = 0; r < kept; ++r) {
    for (auto t : packed[static_cast<std::size_t>(r)]) trained += static_cast<double>(t - kLabelShiftTokens);
  }
  rows.fill = trained / (static_cast<double>(row_len) * static_cast<double>(kept));
  return rows;
}

}  // namespace

GroupRows group_rows(const LengthGroup& group, Batching batching, std::int64_t row_multiple) {
  TRAINYARD_CHECK(row_multiple >= 1, "row multiple below 1");
  const std::int64_t row_len = group.hi;
  if (batching == Batching::ffd_padded) return ffd_padded_rows(group, row_len, row_multiple);
  GroupRows rows;
  rows.sequences = static_cast<std::int64_t>(group.lengths.size());
  std::int64_t count = batching == Batching::padding ? rows.sequences : best_fit_rows(group, row_len);
  rows.packed_rows = count;
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
