#pragma once
// Variable-length workloads: where a mini-batch's sequence lengths come from, how a mini-batch of T tokens (or of N
// documents) is drawn (seeded, deterministic on every platform), how it is cut into length groups, and how a group's
// sequences become the fixed-shape rows a scheme builder takes (packing, padding, or packing into padded rows).
#include <cstdint>
#include <string>
#include <vector>

#include "planner/step.hpp"

namespace trainyard::planner {

// A source of sequence lengths. Built-ins ("dist:commoncrawl", "dist:github") are lognormal counts of tokens
// per document; a text file lists observed lengths (one per line), sampled with replacement; a histogram JSON
// (schema trainyard.lengths.v1: {"bins": [{"min": 1, "max": 1024, "weight": 0.6}, ...]}) gives the share of
// sequences per length range, with lengths log-uniform inside a bin.
struct LengthSource {
  enum class Kind { lognormal, samples, histogram };
  Kind kind = Kind::lognormal;
  std::string origin;        // "dist:github" or the file path: what errors and reports name
  double mu = 0, sigma = 1;  // lognormal: ln(tokens) ~ Normal(mu, sigma)
  std::vector<std::int64_t> samples;
  struct Bin {
    std::int64_t min = 1, max = 1;
    double weight = 0;
  };
  std::vector<Bin> bins;
  std::string description;  // one line: the fit and where its figures come from, or the file's size
};

// The built-in distributions' names, for help texts and errors.
std::vector<std::string> builtin_length_sources();
// "dist:NAME" or a path (.json: a histogram, anything else: lengths one per line). InputError names the
// file, the line or field and what was expected.
LengthSource load_lengths(const std::string& spec);

// Documents shorter than this are redrawn: pipelines drop near-empty documents, and the built-in fits say
// nothing about the lower end (their figures are token shares, which tiny documents barely move).
inline constexpr std::int64_t kMinDocumentTokens = 16;

// Draws documents until `tokens` are reached (the last one cut to land on `tokens` exactly); a document longer
// than `max_len` becomes pieces of `max_len` plus the remainder, as data pipelines cut long documents. The same
// (source, tokens, max_len, seed) gives the same lengths everywhere (own generator and transforms, not the
// standard library's distributions, whose output differs between implementations).
std::vector<std::int64_t> sample_minibatch(const LengthSource& source, std::int64_t tokens, std::int64_t max_len, std::uint64_t seed);

// A document brings one token more than it trains on: the label of its last position. HotSPa's artifact
// (ccchengff/HotSPa-AE hotspa/data_utils/llama_dataset.py, hotspa/llama_hot_switch.py class Bucket) reads each
// document cut at max_len + 1 tokens and packs rows of bound + 1 tokens, so each packed document takes its
// positions plus this many tokens of a row.
inline constexpr std::int64_t kLabelShiftTokens = 1;
// The artifact's mini-batch of `documents` documents (GLOBAL_BATCH_SIZE; hotspa/scripts/exprs_for_paper run 512):
// each drawn length is the document's tokens, cut at max_len + kLabelShiftTokens (the rest is thrown away, not
// split), returned as the positions it trains on (tokens less kLabelShiftTokens). Same generator as
// sample_minibatch: the same (source, documents, max_len, seed) gives the same lengths everywhere.
std::vector<std::int64_t> sample_documents(const LengthSource& source, std::int64_t documents, std::int64_t max_len, std::uint64_t seed);

// First-fit decreasing: the items, longest first, each into the first row with room (rows of `capacity`); the
// rows in the order they were opened, each row's items longest first. The artifact's Bucket.pack_data fills one
// row at a time from the sorted items, which places every item in the same row. InputError when an item exceeds
// `capacity`.
std::vector<std::vector<std::int64_t>> first_fit_decreasing(std::vector<std::int64_t> items, std::int64_t capacity);

// Sequences with lengths in (lo, hi].
struct LengthGroup {
  std::int64_t lo = 0, hi = 0;
  std::vector<std::int64_t> lengths;  // longest first
  std::int64_t tokens() const;
  std::int64_t longest() const { return lengths.empty() ? 0 : lengths.front(); }
};
// Cuts the lengths at `upper_bounds` (ascending; the last must be at least the longest length). Empty groups
// are kept, so group i is always (upper_bounds[i-1], upper_bounds[i]].
std::vector<LengthGroup> group_lengths(const std::vector<std::int64_t>& lengths, const std::vector<std::int64_t>& upper_bounds);

enum class Batching { packing, padding, ffd_padded };
Batching parse_batching(const std::string& text);  // InputError naming --batching ("packing", "padding", "ffd-padded")
std::string_view to_string(Batching b);

// A group as the rows a builder runs: `workload` has rows of seq_len tokens. Packing puts the sequences into
// rows of the group's bound (best-fit decreasing) and attention uses per-document masks, so only
// `attention_density` of each row's causal block is computed; padding gives each sequence its own row, padded
// to the bound, attention over the whole row. Rows are added (empty) up to a multiple of `row_multiple`, what
// the strategy's data-parallel width and micro-batch need.
// ffd-padded is HotSPa's artifact (hotspa/llama_hot_switch.py): the documents packed first-fit decreasing into
// rows of bound + kLabelShiftTokens tokens, each row padded to the bound and attended causally as a whole (no
// per-document mask: padding and neighbours computed); the rows past a multiple of `row_multiple` are dropped, and
// a group left without rows runs `row_multiple` dummy rows of kDummyRowTokens.
struct GroupRows {
  Workload workload;
  double attention_density = 1;  // computed share of the rows' causal attention
  double fill = 1;               // real tokens / row tokens
  std::int64_t sequences = 0;
  std::int64_t packed_rows = 0;   // before rounding to row_multiple
  std::int64_t dropped_rows = 0;  // ffd-padded: packed rows past the last multiple of row_multiple
};
// The artifact's stand-in for a group without a row to run (Bucket.make_dummy_padded_batch: 129 pad tokens, one
// row per data-parallel rank, less the label shift).
inline constexpr std::int64_t kDummyRowTokens = 128;
GroupRows group_rows(const LengthGroup& group, Batching batching, std::int64_t row_multiple);

}  // namespace trainyard::planner
