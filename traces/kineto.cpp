#include "traces/kineto.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <istream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <streambuf>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/interrupt.hpp"
#include "common/json_reader.hpp"

namespace trainyard::traces {

namespace {

using Json = nlohmann::json;

// A file read through zlib: gzip decompressed as it streams, anything else passed through as it is.
class GzStreamBuf : public std::streambuf {
 public:
  explicit GzStreamBuf(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (file_ == nullptr) throw InputError(path, "file", "a readable trace file", "one that cannot be opened");
    gzbuffer(file_, 1 << 17);
  }
  ~GzStreamBuf() override { gzclose(file_); }
  GzStreamBuf(const GzStreamBuf&) = delete;
  GzStreamBuf& operator=(const GzStreamBuf&) = delete;

 protected:
  int_type underflow() override {
    const int n = gzread(file_, buffer_, sizeof buffer_);
    if (n < 0) {
      int code = 0;
      throw InputError(path_, "file", "a readable gzip or JSON file", std::string("a read error: ") + gzerror(file_, &code));
    }
    setg(buffer_, buffer_, buffer_ + n);
    return n == 0 ? traits_type::eof() : traits_type::to_int_type(buffer_[0]);
  }

 private:
  std::string path_;
  gzFile file_;
  char buffer_[1 << 16];
};

// Kineto's times: microseconds since the epoch (PyTorch 1.x and early 2.x) or since baseTimeNanoseconds (2024 on);
// 9e15 us keeps the nanoseconds within int64.
constexpr double kMaxMicroseconds = 9e15;

// One traceEvents element, the fields kept while the parse walks it.
struct Event {
  std::string ph, cat, name, pid_text, tid_text;
  std::optional<std::int64_t> pid, tid;
  std::optional<json::Json> ts, dur;  // numbers: integer microseconds (PyTorch 1.x) or with decimals
  std::optional<std::int64_t> device, stream, bytes, external_id;
  CollectiveInfo collective;
  bool has_collective = false;
  bool has_shapes = false;  // a shape op's args are being read (its "Input Dims" and "Concrete Inputs" kept)
  std::vector<std::vector<std::int64_t>> input_dims;
  std::vector<std::string> concrete_inputs, input_types;
  void clear() { *this = Event{}; }
};

// The SAX walk: depth 1 is the document's object, 2 the traceEvents elements (and distributedInfo's fields), 3 an
// event's fields, 4 its args' fields, 5 and 6 the lists in a shape op's "Input Dims" and "Concrete Inputs". Other
// deeper values (grid, block, ...) are skipped.
class Walker : public nlohmann::json_sax<Json> {
 public:
  explicit Walker(RankTrace& out) : out_(out) {}

  bool null() override { return scalar(Json()); }
  bool boolean(bool v) override { return scalar(Json(v)); }
  bool number_integer(number_integer_t v) override { return scalar(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return scalar(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return scalar(Json(v)); }
  bool string(string_t& v) override { return scalar(Json(std::move(v))); }
  bool binary(binary_t&) override { return scalar(Json()); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    if (depth_ == 1) top_key_ = key_;
    if (depth_ == 3 && in_event_) event_key_ = key_;
    if (depth_ == 4 && in_event_) arg_key_ = key_;
    return true;
  }
  bool start_object(std::size_t) override { return open(false); }
  bool start_array(std::size_t) override { return open(true); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& e) override {
    throw InputError(out_.origin, "byte " + std::to_string(position), "well-formed JSON",
                     json::parse_error_words(e.what()) + " at \"" + last_token.substr(0, 80) + "\" (a file cut short, or not JSON)");
  }

  bool saw_events() const { return saw_events_; }

 private:
  bool in_events() const { return top_key_ == "traceEvents"; }

  bool open(bool array) {
    ++depth_;
    if (depth_ == 1 && array) throw InputError(out_.origin, "document", "a JSON object with traceEvents", "an array");
    if (depth_ == 2 && in_events()) {
      if (!array) throw InputError(out_.origin, "traceEvents", "an array of trace events", "an object");
      saw_events_ = true;
    }
    if (depth_ == 3 && in_events() && !array) {
      event_.clear();
      in_event_ = true;
    }
    // Shapes are read for the ops is_shape_op names only; Kineto writes an event's name before its args.
    if (depth_ == 4 && in_event_ && !array && event_key_ == "args" && is_shape_op(event_.name)) event_.has_shapes = true;
    if (depth_ == 6 && in_event_ && array && arg_key_ == "Input Dims" && event_.has_shapes) event_.input_dims.emplace_back();
    return true;
  }
  bool close() {
    if (depth_ == 3 && in_event_) {
      in_event_ = false;
      finish_event();
    }
    --depth_;
    return true;
  }

  bool scalar(Json v) {
    if (depth_ == 2 && top_key_ == "distributedInfo") {
      if (key_ == "rank" && v.is_number_integer()) out_.rank = v.get<int>();
      if (key_ == "world_size" && v.is_number_integer()) out_.world_size = v.get<int>();
    }
    if (depth_ == 3 && top_key_ == "deviceProperties" && key_ == "name" && v.is_string() && out_.device_name.empty()) {
      out_.device_name = v.get<std::string>();
    }
    if (in_event_ && event_.has_shapes) shape_field(v);
    if (in_event_ && depth_ == 3) event_field(v);
    if (in_event_ && depth_ == 4 && event_key_ == "args") arg_field(v);
    return true;
  }

  static std::optional<std::int64_t> integer(const Json& v) {
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      return u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ? std::optional<std::int64_t>(static_cast<std::int64_t>(u))
                                                                                       : std::nullopt;
    }
    if (v.is_number_integer()) return v.get<std::int64_t>();
    if (v.is_number_float() && std::isfinite(v.get<double>()) && std::abs(v.get<double>()) < 9e15) return std::llround(v.get<double>());
    return std::nullopt;
  }
  // A pid or tid: a number (GPU events, PyTorch 2.x) or text ("stream 7" in 1.x, "" on the closing event).
  static void id_field(const Json& v, std::optional<std::int64_t>& number, std::string& text) {
    if (v.is_string()) {
      text = v.get<std::string>();
    } else {
      number = integer(v);
    }
  }
  void event_field(const Json& v) {
    if (key_ == "ph" && v.is_string()) event_.ph = v.get<std::string>();
    else if (key_ == "cat" && v.is_string()) event_.cat = v.get<std::string>();
    else if (key_ == "name" && v.is_string()) event_.name = v.get<std::string>();
    else if (key_ == "pid") id_field(v, event_.pid, event_.pid_text);
    else if (key_ == "tid") id_field(v, event_.tid, event_.tid_text);
    else if (key_ == "ts" && v.is_number()) event_.ts = v;
    else if (key_ == "dur" && v.is_number()) event_.dur = v;
  }
  void arg_field(const Json& v) {
    CollectiveInfo& c = event_.collective;
    if (key_ == "device") event_.device = integer(v);
    else if (key_ == "stream") event_.stream = integer(v);
    else if (key_ == "bytes") event_.bytes = integer(v);
    else if (key_ == "External id" || key_ == "external id") event_.external_id = integer(v);
    else if (key_ == "Collective name" && v.is_string()) c.name = v.get<std::string>(), event_.has_collective = true;
    else if (key_ == "In msg nelems") c.in_elements = integer(v).value_or(0);
    else if (key_ == "Out msg nelems") c.out_elements = integer(v).value_or(0);
    else if (key_ == "Group size") c.group_size = integer(v).value_or(0);
    else if (key_ == "dtype" && v.is_string()) c.dtype = v.get<std::string>();
  }

  void shape_field(const Json& v) {
    if (depth_ == 6 && arg_key_ == "Input Dims" && !event_.input_dims.empty()) event_.input_dims.back().push_back(integer(v).value_or(-1));
    if (depth_ == 5 && arg_key_ == "Concrete Inputs") event_.concrete_inputs.push_back(v.is_string() ? v.get<std::string>() : json::describe(v));
    if (depth_ == 5 && arg_key_ == "Input type") event_.input_types.push_back(v.is_string() ? v.get<std::string>() : json::describe(v));
  }

  [[noreturn]] void bad(const std::string& field, const std::string& expected, const std::string& found) const {
    throw InputError(out_.origin, "traceEvents[" + std::to_string(out_.events_read - 1) + "]." + field, expected, found);
  }
  // A time in microseconds as nanoseconds: integers exactly (absolute microseconds since the epoch, PyTorch 1.x,
  // need more digits in nanoseconds than a double holds); decimals as the double has them (within about 0.1 us
  // for absolute times, exact for the relative ones of PyTorch 2.4 on).
  std::int64_t time_field(const std::optional<json::Json>& v, const char* field) const {
    if (!v) bad(field, "a time in microseconds", "nothing");
    const double us = v->get<double>();
    if (!std::isfinite(us) || us < 0 || us > kMaxMicroseconds) bad(field, "a time in microseconds from 0 to 9e15", json::describe(*v));
    return v->is_number_integer() ? v->get<std::int64_t>() * 1000 : std::llround(us * 1000.0);  // (the bound keeps both in int64)
  }
  // "stream 7" (PyTorch 1.x) or 7.
  int stream_of(const Event& e) const {
    if (e.stream) return static_cast<int>(*e.stream);
    if (e.tid) return static_cast<int>(*e.tid);
    const auto digits = e.tid_text.find_first_of("0123456789");
    if (digits != std::string::npos) return std::atoi(e.tid_text.c_str() + digits);
    bad("tid", "the GPU stream (a number, or \"stream N\")", "\"" + e.tid_text + "\"");
  }
  std::uint32_t intern(const std::string& name) {
    const auto [it, added] = name_ids_.try_emplace(name, static_cast<std::uint32_t>(out_.names.size()));
    if (added) out_.names.push_back(name);
    return it->second;
  }

  static GpuActivity::Kind memcpy_kind(const std::string& name) {
    if (name.find("HtoD") != std::string::npos) return GpuActivity::Kind::memcpy_h2d;
    if (name.find("DtoH") != std::string::npos) return GpuActivity::Kind::memcpy_d2h;
    if (name.find("PtoP") != std::string::npos) return GpuActivity::Kind::memcpy_p2p;
    if (name.find("DtoD") != std::string::npos) return GpuActivity::Kind::memcpy_d2d;
    return GpuActivity::Kind::memcpy_other;
  }

  void finish_event() {
    ++out_.events_read;
    if ((out_.events_read & 0xFFFF) == 0 && interrupted()) throw Interrupted();
    const Event& e = event_;
    if (e.ph != "X") return;
    const bool legacy = e.cat == "Kernel" || e.cat == "Memcpy" || e.cat == "Memset" || e.cat == "Operator" || e.cat == "Runtime";
    out_.legacy_layout = out_.legacy_layout || legacy;
    if (e.name.rfind("ProfilerStep#", 0) == 0) {
      ProfilerStep s;
      s.number = std::atoll(e.name.c_str() + 13);
      s.start_ns = time_field(e.ts, "ts");
      s.duration_ns = time_field(e.dur, "dur");
      (e.cat == "gpu_user_annotation" ? out_.gpu_steps : out_.steps).push_back(s);
      return;
    }
    if (e.has_collective && e.external_id && (e.cat == "cpu_op" || e.cat == "Operator")) {
      op_collective_[*e.external_id] = e.collective;  // record_param_comms: the kernel sharing its External id gets it
      return;
    }
    if (e.has_shapes && !e.input_dims.empty() && e.external_id && (e.cat == "cpu_op" || e.cat == "Operator")) {
      event_.concrete_inputs.resize(e.input_dims.size());  // older profilers record no Concrete Inputs
      out_.shaped_ops.push_back(
          {*e.external_id, e.name, std::move(event_.input_dims), std::move(event_.concrete_inputs), std::move(event_.input_types)});
      return;
    }
    GpuActivity a;
    if (e.cat == "kernel" || e.cat == "Kernel") {
      a.kind = GpuActivity::Kind::kernel;
    } else if (e.cat == "gpu_memcpy" || e.cat == "Memcpy") {
      a.kind = memcpy_kind(e.name);
    } else if (e.cat == "gpu_memset" || e.cat == "Memset") {
      a.kind = GpuActivity::Kind::memset;
    } else {
      return;
    }
    if (e.name.empty()) bad("name", "the kernel's name", "nothing");
    a.name = intern(e.name);
    a.start_ns = time_field(e.ts, "ts");
    a.duration_ns = time_field(e.dur, "dur");
    if (!e.device && !e.pid) bad("pid", "the GPU (a number)", e.pid_text.empty() ? "nothing" : "\"" + e.pid_text + "\"");
    a.device = static_cast<int>(e.device ? *e.device : *e.pid);
    a.stream = stream_of(e);
    a.bytes = e.bytes.value_or(0);
    a.external_id = e.external_id.value_or(-1);
    if (e.has_collective) {
      a.collective = static_cast<std::int32_t>(out_.collectives.size());
      out_.collectives.push_back(e.collective);
    } else if (e.external_id && e.name.rfind("nccl", 0) == 0) {  // NCCL's kernels only: the rest would cost memory for nothing
      pending_.emplace_back(out_.activities.size(), *e.external_id);
    }
    out_.activities.push_back(a);
  }

 public:
  // Kernels whose collective metadata is on the CPU op they share an External id with (before kineto 8378f0d5).
  void link_collectives() {
    for (const auto& [index, id] : pending_) {
      const auto found = op_collective_.find(id);
      if (found == op_collective_.end()) continue;
      out_.activities[index].collective = static_cast<std::int32_t>(out_.collectives.size());
      out_.collectives.push_back(found->second);
    }
  }

 private:
  RankTrace& out_;
  int depth_ = 0;
  std::string key_, top_key_, event_key_, arg_key_;
  bool in_event_ = false, saw_events_ = false;
  Event event_;
  std::unordered_map<std::string, std::uint32_t> name_ids_;
  std::unordered_map<std::int64_t, CollectiveInfo> op_collective_;
  std::vector<std::pair<std::size_t, std::int64_t>> pending_;
};

int dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, int> sizes = {{"BFloat16", 2}, {"Half", 2}, {"Float", 4}, {"Double", 8},        {"Long", 8},       {"Int", 4},
                                                   {"Byte", 1},     {"Char", 1}, {"Bool", 1},  {"Float8_e4m3fn", 1}, {"Float8_e5m2", 1}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// Kineto writes a step's GPU span once per stream that ran its work (GpuUserEventMap keys them by device and
// stream): one step, from the earliest start to the latest end; the steps come out sorted by start.
void merge_steps(std::vector<ProfilerStep>& steps) {
  std::map<std::int64_t, ProfilerStep> by_number;
  for (const ProfilerStep& s : steps) {
    const auto [it, added] = by_number.try_emplace(s.number, s);
    if (added) continue;
    const std::int64_t end = std::max(it->second.start_ns + it->second.duration_ns, s.start_ns + s.duration_ns);
    it->second.start_ns = std::min(it->second.start_ns, s.start_ns);
    it->second.duration_ns = end - it->second.start_ns;
  }
  steps.clear();
  for (const auto& [number, s] : by_number) steps.push_back(s);
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
}

}  // namespace

bool is_shape_op(const std::string& name) {
  static const std::set<std::string> ops = {"aten::mm",
                                            "aten::addmm",
                                            "aten::bmm",
                                            "aten::baddbmm",
                                            "aten::_cudnn_attention_forward",
                                            "aten::_cudnn_attention_backward",
                                            "aten::_flash_attention_forward",
                                            "aten::_flash_attention_backward"};
  return ops.count(name) > 0;
}

std::int64_t CollectiveInfo::bytes() const { return std::max(in_elements, out_elements) * dtype_bytes(dtype); }

RankTrace read_kineto_file(const std::string& path) {
  RankTrace out;
  out.origin = path;
  GzStreamBuf buffer(path);
  std::istream input(&buffer);
  Walker walker(out);
  Json::sax_parse(input, &walker);
  if (!walker.saw_events()) throw InputError(path, "traceEvents", "an array of trace events (a PyTorch profiler trace)", "none");
  walker.link_collectives();
  if (out.activities.empty()) throw InputError(path, "traceEvents", "GPU kernels, copies or memsets (a trace of a GPU run)", "none");
  std::sort(out.steps.begin(), out.steps.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  merge_steps(out.gpu_steps);
  return out;
}

std::vector<std::string> trace_files(const std::string& path, const std::function<bool(const std::string&)>& is_trace, const std::string& expected) {
  if (!std::filesystem::is_directory(path)) return {path};
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.is_regular_file() && is_trace(entry.path().filename().string())) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw InputError(path, "directory", expected, "none");
  return files;
}

std::vector<std::string> kineto_files(const std::string& path) {
  return trace_files(
      path, [](const std::string& name) { return name.ends_with(".json") || name.ends_with(".json.gz"); },
      "trace files (*.json or *.json.gz, one per rank)");
}

std::vector<RankTrace> read_kineto(const std::string& path) { return read_ranks(kineto_files(path), read_kineto_file); }

std::vector<RankTrace> read_ranks(const std::vector<std::string>& files, RankReader read) {
  std::vector<RankTrace> ranks;
  for (const auto& f : files) ranks.push_back(read(f));
  std::stable_sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return ranks;
}

RankSource each_rank(const std::vector<RankTrace>& ranks) {
  auto next = std::make_shared<std::size_t>(0);
  return [&ranks, next]() { return *next < ranks.size() ? &ranks[(*next)++] : nullptr; };
}

RankSource read_each(std::vector<std::string> files, RankReader read) {
  struct State {
    std::vector<std::string> files;
    std::size_t next = 0;
    std::optional<RankTrace> current;
  };
  auto state = std::make_shared<State>(State{std::move(files), 0, std::nullopt});
  return [state, read]() -> const RankTrace* {
    state->current.reset();  // before the next is read: one trace in memory
    if (state->next == state->files.size()) return nullptr;
    state->current = read(state->files[state->next++]);
    return &*state->current;
  };
}

bool looks_like_kineto(const std::string& path) {
  if (std::filesystem::is_directory(path)) return true;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::string head(1 << 16, '\0');
  const int n = gzread(f, head.data(), static_cast<unsigned>(head.size()));
  const bool gzip = gzdirect(f) == 0;
  gzclose(f);
  head.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  // trainyard's own timelines are plain, carry no "cat" and no schemaVersion; Kineto's events all have a category.
  return gzip || head.find("\"schemaVersion\"") != std::string::npos || head.find("\"cat\"") != std::string::npos;
}

}  // namespace trainyard::traces
