#include "traces/nsys.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/interrupt.hpp"

namespace trainyard::traces {

namespace {

constexpr char kSqliteMagic[16] = "SQLite format 3";           // 15 characters and the terminating NUL, as the file starts
constexpr std::int64_t kPollRows = 4096;                       // rows between two looks at the Ctrl-C flag
constexpr int kProgressInstructions = 100'000;                 // and SQLite's VM instructions (a query's sort or scan)
constexpr std::int64_t kMaxNs = std::int64_t{1} << 62;         // keeps start + duration within int64
constexpr std::uint64_t kAnyProcess = std::uint64_t{1} << 24;  // a GPU table without globalPid: any process's call

// Nsight Systems' serialized ids: the process is bits 24-47 of globalTid and globalPid.
std::uint64_t process_of(std::int64_t global_id) { return (static_cast<std::uint64_t>(global_id) >> 24) & 0xFFFFFF; }
std::uint64_t launch_key(std::uint64_t process, std::int64_t correlation_id) { return (process << 32) | static_cast<std::uint32_t>(correlation_id); }

// SQLite polls this while a statement runs; non-zero stops it with SQLITE_INTERRUPT.
int on_progress(void*) { return interrupted() ? 1 : 0; }

// The connection, read-only, closed on every path. SQLite's own errors become InputErrors naming the file and `where`.
class Database {
 public:
  explicit Database(const std::string& path) : path_(path) {
    sqlite3* db = nullptr;
    const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
    db_.reset(db);  // SQLite hands out a handle to close even when the open fails
    if (db == nullptr) throw InputError(path_ + ": file: expected a readable Nsight Systems SQLite export, got " + sqlite3_errstr(rc));
    if (rc != SQLITE_OK) fail("file", rc);
    // An export is untrusted input: no schema-defined functions, no writes even through corrupt pages.
    int on = 0;
    check("file", sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, &on));
    check("file", sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, &on));
    sqlite3_progress_handler(db, kProgressInstructions, &on_progress, nullptr);
  }

  sqlite3* handle() const { return db_.get(); }
  const std::string& path() const { return path_; }
  void check(const std::string& where, int rc) const {
    if (rc != SQLITE_OK) fail(where, rc);
  }
  [[noreturn]] void fail(const std::string& where, int rc) const {
    if (rc == SQLITE_INTERRUPT) throw Interrupted();
    throw InputError(path_ + ": " + where + ": expected a readable Nsight Systems SQLite export, got SQLite's error \"" + sqlite3_errmsg(db_.get()) +
                     "\"");
  }

 private:
  struct Close {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
  };
  std::string path_;
  std::unique_ptr<sqlite3, Close> db_;
};

// One prepared statement, finalized on every path.
class Statement {
 public:
  Statement(const Database& db, const std::string& sql, std::string where) : db_(db), where_(std::move(where)) {
    db.check(where_, sqlite3_prepare_v2(db.handle(), sql.c_str(), -1, &stmt_, nullptr));  // stmt_ stays null on failure
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  void bind(int index, const std::string& value) { db_.check(where_, sqlite3_bind_text(stmt_, index, value.c_str(), -1, SQLITE_TRANSIENT)); }
  // The next row; false when there is none.
  bool next() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    db_.fail(where_, rc);
  }
  bool null(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }
  std::int64_t integer(int column) const { return sqlite3_column_int64(stmt_, column); }
  std::string text(int column) const {
    const auto* chars = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
    return chars != nullptr ? std::string(chars, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column))) : std::string();
  }

 private:
  const Database& db_;
  std::string where_;
  sqlite3_stmt* stmt_ = nullptr;
};

// A table of the export as it is: present or not, and its columns (older exports have fewer).
class Table {
 public:
  Table(const Database& db, std::string name) : db_(db), name_(std::move(name)) {
    Statement exists(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1", "table " + name_);
    exists.bind(1, name_);
    present_ = exists.next();
    if (!present_) return;
    Statement info(db, "SELECT name FROM pragma_table_info(?1)", "table " + name_);
    info.bind(1, name_);
    while (info.next()) columns_.insert(info.text(0));
  }
  bool present() const { return present_; }
  const std::string& name() const { return name_; }
  bool has(const std::string& column) const { return columns_.count(column) > 0; }
  // `alias."column"` for SQL; an InputError naming the file, the table and the column when it is missing.
  std::string column(const std::string& alias, const std::string& column) const {
    if (!has(column)) throw InputError(db_.path() + ": table " + name_ + ": missing column '" + column + "'");
    return alias + ".\"" + column + "\"";
  }
  // The same, or NULL where the export has no such column.
  std::string optional(const std::string& alias, const std::string& column) const {
    return has(column) ? alias + ".\"" + column + "\"" : std::string("NULL");
  }

 private:
  const Database& db_;
  std::string name_;
  bool present_ = false;
  std::set<std::string> columns_;
};

// The CUDA runtime call that launched a GPU activity.
struct Launch {
  std::int64_t thread = 0;  // globalTid
  std::int64_t start_ns = 0;
  bool found = false;
};

// An NCCL range of NVTX_EVENTS on one thread.
struct NcclRange {
  std::int64_t start_ns = 0, end_ns = 0;
  std::string collective;  // Kineto's name: "allreduce", ...
  std::int64_t bytes = 0;  // 0: unknown
};

// NCCL's range names ("ncclAllReduce") and PyTorch's ("nccl:all_reduce", "nccl:_all_gather_base") as Kineto names
// the collective; "" for any other range ("ncclGroupEnd", ...).
std::string collective_of(const std::string& range) {
  std::string key;
  for (const char c : range.substr(4)) {  // after "nccl"
    if (std::isalpha(static_cast<unsigned char>(c))) key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  static const std::pair<const char*, const char*> kNames[] = {{"allreduce", "allreduce"},
                                                               {"allgather", "allgather"},
                                                               {"reducescatter", "reduce_scatter"},
                                                               {"alltoall", "all_to_all"},
                                                               {"broadcast", "broadcast"},
                                                               {"send", "send"},
                                                               {"recv", "recv"}};
  for (const auto& [prefix, name] : kNames) {
    if (key.rfind(prefix, 0) == 0) return name;
  }
  return "";
}

// The size in NCCL's NVTX payload as Nsight Systems renders it (jsonText): "Message size [bytes]" (collectives) or
// "Bytes" (send, recv), at the top or nested a little; 0 when absent or not JSON.
std::int64_t payload_bytes(const nlohmann::json& j, int depth = 0) {
  if (depth > 3 || (!j.is_object() && !j.is_array())) return 0;
  if (j.is_object()) {
    for (const char* key : {"Message size [bytes]", "Bytes"}) {
      const auto it = j.find(key);
      if (it != j.end() && it->is_number_integer() && it->get<std::int64_t>() > 0) return it->get<std::int64_t>();
    }
  }
  for (const auto& child : j) {
    if (const std::int64_t bytes = payload_bytes(child, depth + 1); bytes > 0) return bytes;
  }
  return 0;
}

// "ProfilerStep#12" -> 12; nullopt for any other name.
std::optional<std::int64_t> step_number(const std::string& name) {
  constexpr std::string_view kPrefix = "ProfilerStep#";
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  std::int64_t n = 0;
  const char* first = name.data() + kPrefix.size();
  const auto [end, error] = std::from_chars(first, name.data() + name.size(), n);
  if (error != std::errc() || end == first) return std::nullopt;
  return n;
}

// "trace_rank3.sqlite" -> 3: the trailing integer of the stem, else -1.
int rank_of(const std::string& path) {
  const std::string stem = std::filesystem::path(path).stem().string();
  std::size_t digits = stem.size();
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(stem[digits - 1]))) --digits;
  int rank = -1;
  if (digits == stem.size() || std::from_chars(stem.data() + digits, stem.data() + stem.size(), rank).ec != std::errc()) return -1;
  return rank;
}

class Reader {
 public:
  explicit Reader(const std::string& path) : db_(path) { out_.origin = path; }

  RankTrace read() {
    const Table strings(db_, "StringIds");
    read_nvtx(strings);
    reserve_activities();
    read_kernels(strings);
    read_copies();
    read_memsets();
    if (out_.activities.empty()) {
      throw InputError(db_.path() + ": tables CUPTI_ACTIVITY_KIND_KERNEL, _MEMCPY, _MEMSET: expected GPU kernels, copies or memsets " +
                       "(an export of a run traced with -t cuda), got none");
    }
    read_launches();
    link_collectives();
    project_steps();
    return std::move(out_);
  }

 private:
  [[noreturn]] void bad(const Table& t, std::int64_t row, const std::string& column, const std::string& expected, const std::string& got) const {
    throw InputError(db_.path() + ": table " + t.name() + " row " + std::to_string(row) + ": column '" + column + "': expected " + expected +
                     ", got " + got);
  }
  // Counts a row, and looks at the Ctrl-C flag every few thousand.
  void next_row() {
    if ((++out_.events_read % kPollRows) == 0 && interrupted()) throw Interrupted();
  }
  // Columns 0 and 1 of `s`: start and end in ns, as start and duration.
  std::pair<std::int64_t, std::int64_t> span(const Statement& s, const Table& t, std::int64_t row) const {
    if (s.null(0)) bad(t, row, "start", "a time in ns", "NULL");
    if (s.null(1)) bad(t, row, "end", "a time in ns", "NULL");
    const std::int64_t start = s.integer(0), end = s.integer(1);
    if (start < 0 || start > kMaxNs) bad(t, row, "start", "a time in ns from 0 to 2^62", std::to_string(start));
    if (end < start || end > kMaxNs) bad(t, row, "end", "a time in ns from 'start' (" + std::to_string(start) + ") to 2^62", std::to_string(end));
    return {start, end - start};
  }
  std::uint32_t intern(const std::string& name) {
    const auto [it, added] = name_ids_.try_emplace(name, static_cast<std::uint32_t>(out_.names.size()));
    if (added) out_.names.push_back(name);
    return it->second;
  }

  // ProfilerStep#N ranges (the steps) and NCCL's or PyTorch's NCCL ranges (kept per thread); nothing else.
  void read_nvtx(const Table& strings) {
    const Table t(db_, "NVTX_EVENTS");
    if (!t.present()) return;
    const bool by_id = t.has("textId") && strings.present(), json_by_id = t.has("jsonTextId") && strings.present();
    if (!t.has("text") && !by_id) t.column("e", "text");  // neither form of the name: names the column missing
    const std::string name = t.has("text") && by_id ? "COALESCE(e.\"text\", n.value)" : t.has("text") ? "e.\"text\"" : "n.value";
    const std::string json = t.has("jsonText") && json_by_id ? "COALESCE(e.\"jsonText\", j.value)"
                             : t.has("jsonText")             ? "e.\"jsonText\""
                             : json_by_id                    ? "j.value"
                                                             : "NULL";
    Statement s(db_,
                "SELECT " + t.column("e", "start") + ", " + t.column("e", "end") + ", " + t.column("e", "globalTid") + ", " + name + ", " + json +
                    " FROM NVTX_EVENTS AS e" + (by_id ? " LEFT JOIN StringIds AS n ON n.id = e.\"textId\"" : "") +
                    (json_by_id ? " LEFT JOIN StringIds AS j ON j.id = e.\"jsonTextId\"" : "") + " WHERE e.\"end\" IS NOT NULL AND (" + name +
                    " LIKE 'ProfilerStep#%' OR " + name + " LIKE 'nccl%')",
                "table NVTX_EVENTS");
    for (std::int64_t row = 1; s.next(); ++row) {
      next_row();
      const auto [start_ns, duration_ns] = span(s, t, row);
      const std::string text = s.text(3);
      if (const auto number = step_number(text)) {
        out_.steps.push_back({*number, start_ns, duration_ns});
        continue;
      }
      if (text.rfind("nccl", 0) != 0) continue;  // LIKE ignores case
      NcclRange r{start_ns, start_ns + duration_ns, collective_of(text), 0};
      if (r.collective.empty()) continue;
      if (!s.null(4)) r.bytes = payload_bytes(nlohmann::json::parse(s.text(4), nullptr, false));
      const std::int64_t thread = s.null(2) ? 0 : s.integer(2);
      longest_range_ns_ = std::max(longest_range_ns_, duration_ns);
      nccl_ranges_[thread].push_back(std::move(r));
    }
    std::sort(out_.steps.begin(), out_.steps.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
    for (auto& [thread, ranges] : nccl_ranges_) {
      std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
    }
  }

  // Columns 2 and 3: deviceId, streamId; 4 and 5: correlationId and globalPid (NULL where the table has none).
  std::string gpu_columns(const Table& t, const std::string& a) const {
    return t.column(a, "start") + ", " + t.column(a, "end") + ", " + t.column(a, "deviceId") + ", " + t.column(a, "streamId") + ", " +
           t.optional(a, "correlationId") + ", " + t.optional(a, "globalPid");
  }
  // The GPU work's vectors sized once from the tables' row counts: grown by doubling, they would hold the old and the
  // new copy at once (half again the memory of the activities, at the peak) and up to twice the room they need.
  void reserve_activities() {
    std::size_t rows = 0;
    for (const std::string name : {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"}) {
      if (!Table(db_, name).present()) continue;
      Statement s(db_, "SELECT COUNT(*) FROM " + name, "table " + name);
      if (s.next()) rows += static_cast<std::size_t>(std::max<std::int64_t>(s.integer(0), 0));
    }
    out_.activities.reserve(rows);
    keys_.reserve(rows);
  }
  void add_activity(const Statement& s, const Table& t, std::int64_t row, GpuActivity a) {
    std::tie(a.start_ns, a.duration_ns) = span(s, t, row);
    a.device = static_cast<std::int32_t>(s.integer(2));
    a.stream = static_cast<std::int32_t>(s.integer(3));
    if (!s.null(4)) {
      const std::size_t index = out_.activities.size();
      keys_.emplace_back(launch_key(s.null(5) ? kAnyProcess : process_of(s.integer(5)), s.integer(4)), index);
      if (is_nccl_kernel(a)) nccl_launches_.push_back({index, Launch{}});
    }
    out_.activities.push_back(a);
  }
  bool is_nccl_kernel(const GpuActivity& a) const {
    const std::string& name = out_.names[a.name];
    return a.kind == GpuActivity::Kind::kernel && (name.rfind("ncclKernel", 0) == 0 || name.rfind("ncclDevKernel", 0) == 0);
  }

  void read_kernels(const Table& strings) {
    const Table t(db_, "CUPTI_ACTIVITY_KIND_KERNEL");
    if (!t.present()) return;
    const std::string name_id = t.has("demangledName") || !t.has("shortName") ? "demangledName" : "shortName";
    const std::string name_column = t.column("k", name_id);
    if (!strings.present()) throw InputError(db_.path() + ": table StringIds: missing (the kernels' names are ids into it)");
    Statement s(db_,
                "SELECT " + gpu_columns(t, "k") + ", " + name_column + ", n.value FROM CUPTI_ACTIVITY_KIND_KERNEL AS k" +
                    " LEFT JOIN StringIds AS n ON n.id = " + name_column,
                "table CUPTI_ACTIVITY_KIND_KERNEL");
    for (std::int64_t row = 1; s.next(); ++row) {
      next_row();
      if (s.null(7)) bad(t, row, name_id, "an id of table StringIds", s.null(6) ? "NULL" : std::to_string(s.integer(6)));
      GpuActivity a;
      a.kind = GpuActivity::Kind::kernel;
      a.name = intern(s.text(7));
      add_activity(s, t, row, a);
    }
  }

  // copyKind as CUPTI numbers it (ENUM_CUDA_MEMCPY_OPER in newer exports, the same numbers in older ones).
  static GpuActivity::Kind copy_kind(std::int64_t copy_kind) {
    switch (copy_kind) {
      case 1: return GpuActivity::Kind::memcpy_h2d;
      case 2: return GpuActivity::Kind::memcpy_d2h;
      case 8: return GpuActivity::Kind::memcpy_d2d;
      case 10: return GpuActivity::Kind::memcpy_p2p;
      default: return GpuActivity::Kind::memcpy_other;
    }
  }
  static const char* copy_name(GpuActivity::Kind kind) {
    switch (kind) {
      case GpuActivity::Kind::memcpy_h2d: return "Memcpy HtoD";
      case GpuActivity::Kind::memcpy_d2h: return "Memcpy DtoH";
      case GpuActivity::Kind::memcpy_d2d: return "Memcpy DtoD";
      case GpuActivity::Kind::memcpy_p2p: return "Memcpy PtoP";
      default: return "Memcpy";
    }
  }
  std::int64_t bytes_of(const Statement& s, const Table& t, std::int64_t row) const {
    if (s.null(6) || s.integer(6) < 0) bad(t, row, "bytes", "a size in bytes", s.null(6) ? "NULL" : std::to_string(s.integer(6)));
    return s.integer(6);
  }

  void read_copies() {
    const Table t(db_, "CUPTI_ACTIVITY_KIND_MEMCPY");
    if (!t.present()) return;
    Statement s(
        db_,
        "SELECT " + gpu_columns(t, "c") + ", " + t.column("c", "bytes") + ", " + t.column("c", "copyKind") + " FROM CUPTI_ACTIVITY_KIND_MEMCPY AS c",
        "table CUPTI_ACTIVITY_KIND_MEMCPY");
    for (std::int64_t row = 1; s.next(); ++row) {
      next_row();
      GpuActivity a;
      a.kind = copy_kind(s.integer(7));
      a.name = intern(copy_name(a.kind));
      a.bytes = bytes_of(s, t, row);
      add_activity(s, t, row, a);
    }
  }

  void read_memsets() {
    const Table t(db_, "CUPTI_ACTIVITY_KIND_MEMSET");
    if (!t.present()) return;
    Statement s(db_, "SELECT " + gpu_columns(t, "m") + ", " + t.column("m", "bytes") + " FROM CUPTI_ACTIVITY_KIND_MEMSET AS m",
                "table CUPTI_ACTIVITY_KIND_MEMSET");
    for (std::int64_t row = 1; s.next(); ++row) {
      next_row();
      GpuActivity a;
      a.kind = GpuActivity::Kind::memset;
      a.name = intern("Memset");
      a.bytes = bytes_of(s, t, row);
      add_activity(s, t, row, a);
    }
  }

  // The runtime calls that launched the GPU work read, streamed. Each call is used as it is read (its activities'
  // step spans grow, an NCCL kernel keeps it), so that nothing is kept per activity but its key, and the keys are
  // freed once read: a trace of millions of kernels would otherwise hold a launch for each.
  void read_launches() {
    const Table t(db_, "CUPTI_ACTIVITY_KIND_RUNTIME");
    if (t.present() && !keys_.empty()) {
      std::sort(keys_.begin(), keys_.end());
      launched_.assign(keys_.size(), false);
      spans_.assign(out_.steps.size(), {kMaxNs, -1});
      Statement s(db_,
                  "SELECT " + t.column("r", "start") + ", " + t.column("r", "globalTid") + ", " + t.column("r", "correlationId") +
                      " FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r",
                  "table CUPTI_ACTIVITY_KIND_RUNTIME");
      while (s.next()) {
        next_row();
        if (s.null(0) || s.null(1) || s.null(2)) continue;
        const std::int64_t thread = s.integer(1), correlation = s.integer(2);
        const Launch l{thread, std::clamp<std::int64_t>(s.integer(0), 0, kMaxNs), true};
        for (const std::uint64_t key : {launch_key(process_of(thread), correlation), launch_key(kAnyProcess, correlation)}) launched(key, l);
      }
    }
    std::vector<std::pair<std::uint64_t, std::size_t>>().swap(keys_);
    std::vector<bool>().swap(launched_);
  }
  // The first runtime call with a key launched every activity with that key; later ones with the same key are
  // ignored.
  void launched(std::uint64_t key, const Launch& l) {
    auto it = std::lower_bound(keys_.begin(), keys_.end(), key, [](const auto& entry, std::uint64_t k) { return entry.first < k; });
    if (it == keys_.end() || it->first != key) return;
    const auto first = static_cast<std::size_t>(it - keys_.begin());
    if (launched_[first]) return;
    launched_[first] = true;
    const std::int64_t step = step_of(l.start_ns);
    for (; it != keys_.end() && it->first == key; ++it) {
      if (step >= 0) extend_step(static_cast<std::size_t>(step), out_.activities[it->second]);
      keep_nccl_launch(it->second, l);
    }
  }
  // The host step whose range holds `start_ns` (the last to start at or before it), or -1 for none.
  std::int64_t step_of(std::int64_t start_ns) const {
    const auto& steps = out_.steps;
    auto it = std::upper_bound(steps.begin(), steps.end(), start_ns, [](std::int64_t t, const ProfilerStep& s) { return t < s.start_ns; });
    if (it == steps.begin()) return -1;
    --it;
    return start_ns > it->start_ns + it->duration_ns ? -1 : it - steps.begin();
  }
  void extend_step(std::size_t step, const GpuActivity& a) {
    auto& span = spans_[step];
    span = {std::min(span.first, a.start_ns), std::max(span.second, a.start_ns + a.duration_ns)};
    linked_ = true;
  }
  void keep_nccl_launch(std::size_t activity, const Launch& l) {
    if (nccl_launches_.empty()) return;
    const auto it = std::lower_bound(nccl_launches_.begin(), nccl_launches_.end(), activity,
                                     [](const auto& entry, std::size_t i) { return entry.first < i; });
    if (it != nccl_launches_.end() && it->first == activity) it->second = l;
  }

  // An NCCL kernel gets the NCCL ranges enclosing its launch on the launching thread, innermost first: the name of
  // the first that has one, the size of the first that has one.
  void link_collectives() {
    for (const auto& [activity, l] : nccl_launches_) {
      if (!l.found) continue;
      GpuActivity& a = out_.activities[activity];
      const auto thread = nccl_ranges_.find(l.thread);
      if (thread == nccl_ranges_.end()) continue;
      const auto& ranges = thread->second;
      CollectiveInfo info;
      std::int64_t bytes = 0;
      // Ranges starting after the launch cannot hold it; none longer than the longest starts before it minus that.
      auto it = std::upper_bound(ranges.begin(), ranges.end(), l.start_ns, [](std::int64_t t, const NcclRange& r) { return t < r.start_ns; });
      while (it != ranges.begin()) {
        --it;
        if (it->start_ns < l.start_ns - longest_range_ns_) break;
        if (it->end_ns < l.start_ns) continue;
        if (info.name.empty()) info.name = it->collective;
        if (bytes == 0) bytes = it->bytes;
      }
      if (info.name.empty()) continue;
      if (bytes > 0) info.in_elements = info.out_elements = bytes, info.dtype = "Byte";
      a.collective = static_cast<std::int32_t>(out_.collectives.size());
      out_.collectives.push_back(info);
    }
  }

  // The GPU's step spans: each host step's span covers the GPU work whose runtime call started inside the host
  // step (the GPU runs behind the host, so this work often ends after the host step, even after the next one
  // starts). engine_compare counts GPU work in the GPU's steps where a trace has them; with the host's only it would
  // cut the steps at the host's boundaries and lose what runs after the last host step. A step that launched
  // nothing gets an empty span at its host start. No work linked to any step (no runtime table): no spans. The spans
  // grew while the runtime calls were read (read_launches).
  void project_steps() {
    const auto& steps = out_.steps;
    if (!linked_) return;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const auto [first, last] = spans_[i];
      out_.gpu_steps.push_back(last < 0 ? ProfilerStep{steps[i].number, steps[i].start_ns, 0} : ProfilerStep{steps[i].number, first, last - first});
    }
    std::sort(out_.gpu_steps.begin(), out_.gpu_steps.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  }

  Database db_;
  RankTrace out_;
  std::unordered_map<std::string, std::uint32_t> name_ids_;
  // Until the runtime calls are read: (process << 32 | correlationId, activity), sorted by key once all the GPU work
  // is read, and per key (at its first entry) whether a runtime call has launched it yet.
  std::vector<std::pair<std::uint64_t, std::size_t>> keys_;
  std::vector<bool> launched_;
  std::vector<std::pair<std::size_t, Launch>> nccl_launches_;             // NCCL kernels with a key, by activity: their launch
  std::vector<std::pair<std::int64_t, std::int64_t>> spans_;              // per host step: first start, last end of its GPU work
  bool linked_ = false;                                                   // any GPU work launched in a host step
  std::unordered_map<std::int64_t, std::vector<NcclRange>> nccl_ranges_;  // globalTid -> ranges by start
  std::int64_t longest_range_ns_ = 0;
};

bool has_sqlite_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[sizeof kSqliteMagic] = {};
  return in.read(head, sizeof head) && std::memcmp(head, kSqliteMagic, sizeof head) == 0;
}

}  // namespace

RankTrace read_nsys_file(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) throw InputError(path, "file", "an Nsight Systems SQLite export", "no such file");
  if (!has_sqlite_magic(path)) {
    throw InputError(path, "file", "an Nsight Systems SQLite export (nsys export --type sqlite)", "a file that is not an SQLite database");
  }
  RankTrace out = Reader(path).read();
  out.rank = rank_of(path);
  return out;
}

std::vector<std::string> nsys_files(const std::string& path) {
  return trace_files(
      path, [](const std::string& name) { return name.ends_with(".sqlite"); }, "Nsight Systems SQLite exports (*.sqlite, one per rank)");
}

std::vector<RankTrace> read_nsys(const std::string& path) { return read_ranks(nsys_files(path), read_nsys_file); }

bool looks_like_sqlite(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return std::filesystem::is_regular_file(path, ec) && has_sqlite_magic(path);
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == ".sqlite") return true;
  }
  return false;
}

}  // namespace trainyard::traces
