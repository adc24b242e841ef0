#pragma once
// Strict reading of trainyard's JSON files. Every accessor names the file and the dotted field path in its
// error; finish() rejects fields nobody asked for, so a typo ("hbm_gb") is an error, not a silent default.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/input_file.hpp"

namespace trainyard::json {

using Json = nlohmann::json;

// Parses JSON text; a syntax error becomes an InputError "<origin>:<line>:<column>: malformed JSON: ...". Also
// refused, naming the origin: empty text, a byte that is not UTF-8 text (a binary file), and a key repeated in
// an object (nlohmann would keep the last one silently).
Json parse(std::string_view text, const std::string& origin);
// The JSON library's parse error in a few words ("syntax error while parsing object key - invalid string: missing
// closing quote"), without its exception id, position and last token, which the caller says its own way.
std::string parse_error_words(const std::string& what);
// InputError when `document` is a trainyard plan file (format trainyard.plan.v1) where `expected` (e.g. "a task
// graph") was asked for: a plan is the input readers most often get by mistake, and their own missing-field error
// would not say what the file is.
void refuse_plan_file(const Json& document, const std::string& origin, const std::string& expected);
// Reads (at most `cap_bytes`, common/input_file.hpp) and parses a file; a missing or unreadable file, a directory
// or a file over the cap is an InputError naming the path.
Json parse_file(const std::string& path, std::uint64_t cap_bytes = kJsonFileCapBytes);

// Where a figure comes from. Every number in a hardware profile carries one.
struct Source {
  enum class Kind { datasheet, measured, estimate };
  Kind kind = Kind::estimate;
  std::string document;  // datasheet
  std::string date;      // measured: YYYY-MM-DD
  std::string command;   // measured: the command that produced it
  std::string basis;     // estimate: why this number; measured (optional): how the points became the figure
  std::string device;    // measured (optional): the device it ran on

  std::string describe() const;  // "datasheet: NVIDIA A100 ..." / "measured 2026-11-21: trainyard ..." / ...
};
std::string_view to_string(Source::Kind kind);
using Sources = std::map<std::string, Source>;

struct Figure {
  double value = 0;
  std::string source_id;
  Source source;
  std::string note;
};

// The accepted range of a number, in words for the error message.
struct Bound {
  double min = 0;
  double max = 0;
  std::string unit;  // e.g. "bytes", "GB/s", "TFLOP/s", "" for pure numbers
  bool integer = false;
  bool bytes_given_in_gb = false;  // if true, a too-small value that would fit when scaled by 2^30 gets a hint
};

class Reader {
 public:
  // `origin` names the file (or "--model" for command-line input); `path` is this object's dotted path.
  Reader(const Json& object, std::string origin, std::string path = "");

  const std::string& origin() const { return origin_; }
  std::string field_path(std::string_view key) const;
  bool has(std::string_view key) const;

  std::string string(std::string_view key) const;
  std::optional<std::string> optional_string(std::string_view key) const;
  std::string choice(std::string_view key, const std::vector<std::string>& allowed) const;
  bool boolean(std::string_view key) const;
  std::int64_t integer(std::string_view key, std::int64_t min, std::int64_t max) const;
  double number(std::string_view key, const Bound& bound) const;
  Reader object(std::string_view key) const;
  std::vector<Reader> objects(std::string_view key) const;  // a non-empty array of objects
  Sources sources(std::string_view key) const;
  // A "<id in sources>" string field: the source it names (its id into `id` when given).
  Source source(std::string_view key, const Sources& sources, std::string* id = nullptr) const;
  // {"value": <number within bound>, "source": "<id in sources>", "note": "..."?}
  Figure figure(std::string_view key, const Bound& bound, const Sources& sources) const;
  // The raw value (marked as read), for shapes the typed accessors do not cover.
  const Json& raw(std::string_view key) const { return at(key); }
  // Requires `key` to equal `expected` exactly (used for the "schema" tag).
  void expect_string(std::string_view key, std::string_view expected) const;

  // Throws for the first field present in the object that no accessor has read.
  void finish() const;

  [[noreturn]] void fail(std::string_view key, const std::string& expected, const std::string& got) const;

 private:
  const Json& at(std::string_view key) const;
  double check_number(const Json& value, std::string_view key, const Bound& bound) const;

  const Json* json_;
  std::string origin_;
  std::string path_;
  mutable std::set<std::string, std::less<>> used_;
};

// How a JSON value is shown in an error: numbers and strings as written, other types by name.
std::string describe(const Json& value);

// The opening every profile file shares (GPU, node, model, stack, collective library): its schema, checked (a
// file of another kind is refused by name), then its name and description; the profile's origin is the file.
template <class Profile>
void read_header(const Reader& r, std::string_view schema, Profile& profile) {
  r.expect_string("schema", schema);
  profile.origin = r.origin();
  profile.name = r.string("name");
  profile.description = r.string("description");
}

}  // namespace trainyard::json
