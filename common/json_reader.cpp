#include "common/json_reader.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <unordered_set>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/units.hpp"

namespace trainyard::json {

namespace {

// nlohmann reports a byte offset; people want line:column.
std::string line_column(std::string_view text, std::size_t byte) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return std::to_string(line) + ":" + std::to_string(column);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string format_bound(const Bound& bound) {
  std::ostringstream out;
  out << (bound.integer ? "an integer" : "a number") << " in [" << format_number(bound.min) << ", " << format_number(bound.max) << "]";
  if (!bound.unit.empty()) out << " " << bound.unit;
  return out.str();
}

// The offset of the first byte that cannot be in JSON text: a control character other than tab, newline and
// carriage return (JSON strings escape them), or a byte that is not UTF-8. npos for text.
std::size_t first_binary_byte(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = bytes[i];
    if (c < 0x80) {
      if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return i;
      ++i;
      continue;
    }
    // Lead byte: length and the range of the first continuation (excludes overlongs and surrogates).
    std::size_t length = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) length = 2;
    else if (c >= 0xE0 && c <= 0xEF) length = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) length = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return i;
    if (i + length > text.size() || bytes[i + 1] < lo || bytes[i + 1] > hi) return i;
    for (std::size_t k = 2; k < length; ++k) {
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xBF) return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

// A first pass over the text (nlohmann's SAX interface, no tree built) that refuses a key repeated in an object
// (nlohmann's tree keeps only the last one), naming it and the object's path in the document. nlohmann's
// parse-with-callback would see keys too, but it rescans the parent container at every object's end: quadratic
// in a trace's array of events.
class DuplicateKeyCheck : public nlohmann::json_sax<Json> {
 public:
  explicit DuplicateKeyCheck(const std::string& origin) : origin_(origin) {}

  bool null() override { return element_done(); }
  bool boolean(bool) override { return element_done(); }
  bool number_integer(number_integer_t) override { return element_done(); }
  bool number_unsigned(number_unsigned_t) override { return element_done(); }
  bool number_float(number_float_t, const string_t&) override { return element_done(); }
  bool string(string_t&) override { return element_done(); }
  bool binary(binary_t&) override { return element_done(); }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& key) override {
    Frame& frame = frames_[depth_ - 1];
    if (!frame.add(key)) throw InputError(origin_, path(key), "each key once in an object", "\"" + key + "\" twice");
    frame.last = key;
    return true;
  }
  // The text is parsed again for the tree, which reports the error with its position.
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  // Frames are reused as depth comes and goes (their key lists keep their capacity).
  bool open(bool object) {
    // No file of trainyard's nests beyond ~6 levels; a deep one is refused here rather than walked recursively.
    if (depth_ >= kMaxDepth) throw InputError(origin_ + ": JSON nested deeper than " + std::to_string(kMaxDepth) + " levels");
    if (frames_.size() <= depth_) frames_.resize(depth_ + 1);
    Frame& frame = frames_[depth_++];
    frame.object = object;
    frame.few.clear();
    if (!frame.many.empty()) frame.many = {};
    frame.index = 0;
    return true;
  }
  bool close() {
    --depth_;
    return element_done();
  }
  // An element of an array is complete: the next one has the next index.
  bool element_done() {
    if (depth_ > 0 && !frames_[depth_ - 1].object) ++frames_[depth_ - 1].index;
    return true;
  }

  struct Frame {
    bool object = true;
    std::string last;                      // objects: the key being read
    std::vector<std::string> few;          // most objects are small: a scan beats hashing
    std::unordered_set<std::string> many;  // large ones (a scan would be quadratic)
    std::size_t index = 0;                 // arrays: the element being read

    bool add(const std::string& key) {
      if (many.empty() && few.size() < 32) {
        if (std::find(few.begin(), few.end(), key) != few.end()) return false;
        few.push_back(key);
        return true;
      }
      if (!few.empty()) {
        many.insert(std::make_move_iterator(few.begin()), std::make_move_iterator(few.end()));
        few.clear();
      }
      return many.insert(key).second;
    }
  };

  // "tasks[3].name": the path of `key` in the innermost object.
  std::string path(const std::string& key) const {
    std::string out;
    for (std::size_t i = 0; i + 1 < depth_; ++i) {
      const Frame& f = frames_[i];
      if (f.object) out += (out.empty() ? "" : ".") + f.last;
      else out += "[" + std::to_string(f.index) + "]";
    }
    return out + (out.empty() ? "" : ".") + key;
  }

  static constexpr std::size_t kMaxDepth = 256;
  const std::string& origin_;
  std::vector<Frame> frames_;
  std::size_t depth_ = 0;
};

}  // namespace

std::string parse_error_words(const std::string& what) {
  // nlohmann: "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error while parsing value -
  // invalid literal; last read: 'tru'; expected ..."
  std::string words = what;
  if (const auto id = words.find("] "); words.rfind("[json.exception", 0) == 0 && id != std::string::npos) words = words.substr(id + 2);
  if (words.rfind("parse error", 0) == 0) {
    if (const auto colon = words.find(": "); colon != std::string::npos) words = words.substr(colon + 2);
  }
  if (const auto last = words.find("; last read"); last != std::string::npos) words = words.substr(0, last);
  return words;
}

void refuse_plan_file(const Json& document, const std::string& origin, const std::string& expected) {
  const auto format = document.is_object() ? document.find("format") : document.end();
  if (format != document.end() && *format == "trainyard.plan.v1") {
    throw InputError(origin, "format", expected, "a plan file (trainyard.plan.v1), which simulate --plan, run --plan and export --plan read");
  }
}

Json parse(std::string_view text, const std::string& origin) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    throw InputError(origin + ": the file is empty (expected a JSON document)");
  }
  if (const std::size_t at = first_binary_byte(text); at != std::string_view::npos) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[at])));
    throw InputError(origin + ":" + line_column(text, at) + ": not JSON text: byte " + hex + " at offset " + std::to_string(at) +
                     " is neither printable UTF-8 nor whitespace (a binary file?)");
  }
  try {
    DuplicateKeyCheck check(origin);
    Json::sax_parse(text.begin(), text.end(), &check);
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    throw InputError(origin + ":" + line_column(text, e.byte == 0 ? 0 : e.byte - 1) + ": malformed JSON: " + parse_error_words(e.what()));
  } catch (const Json::out_of_range& e) {  // a number beyond a double's range, e.g. 1e999 (found by fuzzing)
    std::string detail = e.what();
    if (auto pos = detail.find("] "); pos != std::string::npos) detail = detail.substr(pos + 2);
    throw InputError(origin + ": malformed JSON: " + detail);
  }
}

Json parse_file(const std::string& path, std::uint64_t cap_bytes) { return parse(read_input_file(path, cap_bytes, "a JSON file"), path); }

std::string_view to_string(Source::Kind kind) {
  switch (kind) {
    case Source::Kind::datasheet: return "datasheet";
    case Source::Kind::measured: return "measured";
    case Source::Kind::estimate: return "estimate";
  }
  return "?";
}

std::string Source::describe() const {
  switch (kind) {
    case Kind::datasheet: return "datasheet: " + document;
    case Kind::measured:
      return "measured " + date + (device.empty() ? "" : " on " + device) + ": " + command + (basis.empty() ? "" : " (" + basis + ")");
    case Kind::estimate: return "estimate: " + basis;
  }
  return "?";
}

std::string describe(const Json& value) {
  if (value.is_number() || value.is_boolean()) return value.dump();
  // Invalid UTF-8 (a binary custom: spec) is shown replaced rather than thrown from dump() (found by fuzzing).
  if (value.is_string()) return value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (value.is_null()) return "null";
  if (value.is_array()) return "an array";
  return "an object";
}

Reader::Reader(const Json& object, std::string origin, std::string path) : json_(&object), origin_(std::move(origin)), path_(std::move(path)) {
  if (!object.is_object()) {
    throw InputError(origin_, path_.empty() ? "(top level)" : path_, "a JSON object", describe(object));
  }
}

std::string Reader::field_path(std::string_view key) const { return path_.empty() ? std::string(key) : path_ + "." + std::string(key); }

bool Reader::has(std::string_view key) const { return json_->contains(key); }

void Reader::fail(std::string_view key, const std::string& expected, const std::string& got) const {
  throw InputError(origin_, field_path(key), expected, got);
}

const Json& Reader::at(std::string_view key) const {
  auto it = json_->find(key);
  if (it == json_->end()) fail(key, "this field to be present", "nothing (missing field)");
  used_.emplace(key);
  return *it;
}

std::string Reader::string(std::string_view key) const {
  const Json& value = at(key);
  if (!value.is_string() || value.get_ref<const std::string&>().empty()) {
    fail(key, "a non-empty string", describe(value));
  }
  return value.get<std::string>();
}

std::optional<std::string> Reader::optional_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return string(key);
}

std::string Reader::choice(std::string_view key, const std::vector<std::string>& allowed) const {
  const Json& value = at(key);
  if (value.is_string()) {
    for (const auto& option : allowed) {
      if (value.get_ref<const std::string&>() == option) return option;
    }
  }
  fail(key, "one of: " + join(allowed), describe(value));
}

bool Reader::boolean(std::string_view key) const {
  const Json& value = at(key);
  if (!value.is_boolean()) fail(key, "true or false", describe(value));
  return value.get<bool>();
}

double Reader::check_number(const Json& value, std::string_view key, const Bound& bound) const {
  if (!value.is_number()) fail(key, format_bound(bound), describe(value));
  const double x = value.get<double>();
  const bool whole = std::floor(x) == x;
  if (std::isfinite(x) && x >= bound.min && x <= bound.max && (!bound.integer || whole)) return x;
  std::string got = describe(value);
  if (x > 0 && x < bound.min && bound.bytes_given_in_gb && x * 1073741824.0 >= bound.min && x * 1073741824.0 <= bound.max) {
    got += " (this looks like GB or GiB; the field is in bytes, e.g. " + format_number(x * 1073741824.0) + " for " + describe(value) + " GiB)";
  } else if (x <= 0 && bound.min > 0) {
    got += " (sizes and rates must be positive)";
  }
  fail(key, format_bound(bound), got);
}

std::int64_t Reader::integer(std::string_view key, std::int64_t min, std::int64_t max) const {
  Bound bound{static_cast<double>(min), static_cast<double>(max), "", true, false};
  return static_cast<std::int64_t>(check_number(at(key), key, bound));
}

double Reader::number(std::string_view key, const Bound& bound) const { return check_number(at(key), key, bound); }

Reader Reader::object(std::string_view key) const {
  const Json& value = at(key);
  if (!value.is_object()) fail(key, "a JSON object", describe(value));
  return Reader(value, origin_, field_path(key));
}

std::vector<Reader> Reader::objects(std::string_view key) const {
  const Json& value = at(key);
  if (!value.is_array() || value.empty()) fail(key, "a non-empty array of objects", describe(value));
  std::vector<Reader> out;
  for (std::size_t i = 0; i < value.size(); ++i) {
    out.emplace_back(value[i], origin_, field_path(key) + "[" + std::to_string(i) + "]");
  }
  return out;
}

Sources Reader::sources(std::string_view key) const {
  Sources out;
  Reader all = object(key);
  for (const auto& [id, value] : json_->at(std::string(key)).items()) {
    Reader entry = all.object(id);
    Source source;
    const std::string kind = entry.choice("kind", {"datasheet", "measured", "estimate"});
    if (kind == "datasheet") {
      source.kind = Source::Kind::datasheet;
      source.document = entry.string("document");
    } else if (kind == "measured") {
      source.kind = Source::Kind::measured;
      source.date = entry.string("date");
      source.command = entry.string("command");
      source.device = entry.optional_string("device").value_or("");
      source.basis = entry.optional_string("basis").value_or("");
      if (source.date.size() != 10 || source.date[4] != '-' || source.date[7] != '-') {
        entry.fail("date", "a date YYYY-MM-DD", "\"" + source.date + "\"");
      }
    } else {
      source.kind = Source::Kind::estimate;
      source.basis = entry.string("basis");
    }
    entry.finish();
    out.emplace(id, std::move(source));
  }
  if (out.empty()) fail(key, "at least one source", "an empty object");
  return out;
}

Source Reader::source(std::string_view key, const Sources& sources, std::string* id) const {
  const std::string name = string(key);
  auto it = sources.find(name);
  if (it == sources.end()) {
    std::vector<std::string> ids;
    for (const auto& [known, _] : sources) ids.push_back(known);
    fail(key, "an id listed in \"sources\" (" + join(ids) + ")", "\"" + name + "\"");
  }
  if (id != nullptr) *id = name;
  return it->second;
}

Figure Reader::figure(std::string_view key, const Bound& bound, const Sources& sources) const {
  if (has(key) && !at(key).is_object()) {
    fail(key, "a figure object {\"value\": ..., \"source\": ...} with value " + format_bound(bound), describe(at(key)));
  }
  Reader entry = object(key);
  Figure figure;
  figure.value = entry.number("value", bound);
  figure.source = entry.source("source", sources, &figure.source_id);
  figure.note = entry.optional_string("note").value_or("");
  entry.finish();
  return figure;
}

void Reader::expect_string(std::string_view key, std::string_view expected) const {
  const Json& value = at(key);
  if (!value.is_string() || value.get_ref<const std::string&>() != expected) {
    fail(key, "\"" + std::string(expected) + "\"", describe(value));
  }
}

void Reader::finish() const {
  std::vector<std::string> known(used_.begin(), used_.end());
  for (const auto& [key, _] : json_->items()) {
    if (!used_.contains(key)) {
      fail(key, "a known field (" + join(known) + ")", "an unknown field");
    }
  }
}

}  // namespace trainyard::json
