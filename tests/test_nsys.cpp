// Nsight Systems SQLite exports (traces/nsys.hpp): hand-made fixtures written as SQL (tests/data/traces/nsys/*.sql,
// described in tests/data/traces/README.md), loaded into databases here; every field the reader fills, the older
// schema, ranks in a directory, bad files named by file, table and column, and the comparison with a simulated step.
#include <sqlite3.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/error.hpp"
#include "test_support.hpp"
#include "traces/engine_compare.hpp"
#include "traces/kernel_classes.hpp"
#include "traces/nsys.hpp"

namespace trainyard::traces {
namespace {

namespace fs = std::filesystem;
const std::string kNsys = std::string(TRAINYARD_TEST_DATA_DIR) + "/traces/nsys/";

// The SQL script `sql` (under tests/data/traces/nsys/) run into a new database `name` in `dir`; its path.
std::string make_export(const test::TempDir& dir, const std::string& sql, const std::string& name) {
  const std::string path = (dir.path() / name).string();
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, test::read_file(kNsys + sql).c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << sql << ": " << (error != nullptr ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
  return path;
}

int count_kind(const RankTrace& r, GpuActivity::Kind kind) {
  int n = 0;
  for (const auto& a : r.activities) n += a.kind == kind;
  return n;
}
const GpuActivity& named(const RankTrace& r, const std::string& prefix, int nth = 0) {
  for (const auto& a : r.activities) {
    if (r.names[a.name].rfind(prefix, 0) == 0 && nth-- == 0) return a;
  }
  ADD_FAILURE() << "no activity " << prefix;
  static const GpuActivity none;
  return none;
}

TEST(Nsys, CurrentSchemaReadWithKindsStreamsStepsAndCollectives) {
  const test::TempDir dir;
  const RankTrace t = read_nsys_file(make_export(dir, "nsys-current.sql", "profile_rank3.sqlite"));
  EXPECT_EQ(t.rank, 3);  // the file name's trailing integer
  EXPECT_EQ(t.world_size, 0);
  EXPECT_FALSE(t.legacy_layout);
  ASSERT_EQ(t.activities.size(), 20u);  // 10 kernels, 8 copies, 2 memsets
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::kernel), 10);
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::memcpy_h2d), 2);
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::memcpy_d2h), 2);
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::memcpy_d2d), 2);
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::memcpy_p2p), 1);
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::memcpy_other), 1);  // copyKind 3, host to CUDA array
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::memset), 2);
  // Kernels: demangled names through StringIds, in table order; times in ns as start and duration.
  const GpuActivity& gemm = t.activities[0];
  EXPECT_EQ(t.names[gemm.name], "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT");
  EXPECT_EQ(gemm.start_ns, 2'150'000);
  EXPECT_EQ(gemm.duration_ns, 100'000);
  EXPECT_EQ(gemm.device, 0);
  EXPECT_EQ(gemm.stream, 7);
  EXPECT_EQ(gemm.collective, -1);
  EXPECT_EQ(t.names[t.activities[1].name].rfind("void flash::flash_fwd_kernel<", 0), 0u);  // demangledName, not shortName
  EXPECT_EQ(named(t, "void at::native::vectorized_elementwise_kernel").duration_ns, 10'000);
  EXPECT_EQ(named(t, "my_custom_kernel").duration_ns, 5'000);
  // Copies and memsets: bytes, streams, kinds from copyKind.
  const GpuActivity& other = named(t, "Memcpy");
  EXPECT_EQ(other.kind, GpuActivity::Kind::memcpy_other);
  EXPECT_EQ(other.bytes, 65'536);
  EXPECT_EQ(named(t, "Memcpy HtoD").bytes, 1 << 20);
  EXPECT_EQ(named(t, "Memcpy HtoD").duration_ns, 40'000);
  EXPECT_EQ(named(t, "Memcpy DtoH").bytes, 512 << 10);
  EXPECT_EQ(named(t, "Memcpy DtoH").stream, 8);
  EXPECT_EQ(named(t, "Memcpy DtoD").bytes, 2 << 20);
  EXPECT_EQ(named(t, "Memcpy PtoP").bytes, 8 << 20);
  EXPECT_EQ(named(t, "Memcpy PtoP").stream, 30);
  EXPECT_EQ(named(t, "Memset").bytes, 4096);
  EXPECT_EQ(named(t, "Memset").kind, GpuActivity::Kind::memset);
  // Steps: #3 by text, #4 by textId; the mark named like a step is not one.
  ASSERT_EQ(t.steps.size(), 2u);
  EXPECT_EQ(t.steps[0].number, 3);
  EXPECT_EQ(t.steps[0].start_ns, 2'000'000);
  EXPECT_EQ(t.steps[0].duration_ns, 1'000'000);
  EXPECT_EQ(t.steps[1].number, 4);
  EXPECT_EQ(t.steps[1].start_ns, 3'000'000);
  // The GPU's steps: from the first to the last GPU work launched in each host step (the all-reduce and the D2H copy
  // run past the host step's end); the warm-up copy, launched before, is in none.
  ASSERT_EQ(t.gpu_steps.size(), 2u);
  EXPECT_EQ(t.gpu_steps[0].number, 3);
  EXPECT_EQ(t.gpu_steps[0].start_ns, 2'100'000);
  EXPECT_EQ(t.gpu_steps[0].duration_ns, 1'120'000);
  EXPECT_EQ(t.gpu_steps[1].number, 4);
  EXPECT_EQ(t.gpu_steps[1].start_ns, 3'100'000);
  EXPECT_EQ(t.gpu_steps[1].duration_ns, 1'120'000);
  // Collectives: the NCCL kernels get the enclosing ncclAllReduce range of their launching thread, with the payload's
  // size from jsonText (step #3) and jsonTextId (step #4).
  for (int step = 0; step < 2; ++step) {
    const GpuActivity& nccl = named(t, "ncclDevKernel_AllReduce", step);
    EXPECT_EQ(nccl.stream, 20);
    EXPECT_EQ(nccl.duration_ns, 400'000);
    ASSERT_GE(nccl.collective, 0);
    const CollectiveInfo& c = t.collectives[static_cast<std::size_t>(nccl.collective)];
    EXPECT_EQ(c.name, "allreduce");
    EXPECT_EQ(c.bytes(), 16 << 20);
    EXPECT_EQ(c.group_size, 0);
  }
  EXPECT_EQ(t.collectives.size(), 2u);
  EXPECT_EQ(t.events_read, 20 + 6 + 21);  // the GPU rows, the NVTX ranges the query keeps (steps, nccl*), the runtime rows
}

TEST(Nsys, OlderSchemaWithoutMetadataEnumsOrMemsetsReads) {
  const test::TempDir dir;
  const RankTrace t = read_nsys_file(make_export(dir, "nsys-legacy.sql", "legacy.sqlite"));
  EXPECT_EQ(t.rank, -1);  // no trailing integer
  ASSERT_EQ(t.activities.size(), 6u);
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::kernel), 4);
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::memcpy_h2d), 2);
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::memset), 0);
  const GpuActivity& gemm = named(t, "sm90_xmma_gemm_bf16bf16");
  EXPECT_EQ(gemm.device, 1);
  EXPECT_EQ(gemm.stream, 13);
  EXPECT_EQ(gemm.duration_ns, 300'000);
  EXPECT_EQ(named(t, "Memcpy HtoD").bytes, 256 << 10);
  ASSERT_EQ(t.steps.size(), 2u);
  EXPECT_EQ(t.steps[0].number, 0);
  EXPECT_EQ(t.steps[1].duration_ns, 2'000'000);
  ASSERT_EQ(t.gpu_steps.size(), 2u);
  EXPECT_EQ(t.gpu_steps[1].start_ns, 12'100'000);
  EXPECT_EQ(t.gpu_steps[1].duration_ns, 900'000);
  // PyTorch's range names the collective; without jsonText its size is unknown.
  const GpuActivity& nccl = named(t, "ncclKernel_AllReduce");
  EXPECT_EQ(nccl.stream, 14);
  ASSERT_GE(nccl.collective, 0);
  EXPECT_EQ(t.collectives[static_cast<std::size_t>(nccl.collective)].name, "allreduce");
  EXPECT_EQ(t.collectives[static_cast<std::size_t>(nccl.collective)].bytes(), 0);
}

// The committed databases of the directory are the SQL scripts beside them, loaded.
TEST(Nsys, RanksInADirectoryOrderedByRankWithoutRuntimeTable) {
  const auto ranks = read_nsys(kNsys + "ranks");
  ASSERT_EQ(ranks.size(), 2u);
  const test::TempDir dir;
  for (int r = 0; r < 2; ++r) {
    const RankTrace& t = ranks[static_cast<std::size_t>(r)];
    SCOPED_TRACE(t.origin);
    EXPECT_EQ(t.rank, r);
    EXPECT_NE(t.origin.find(r == 0 ? "nodeB-rank0.sqlite" : "nodeA-rank1.sqlite"), std::string::npos);  // by rank, not by name
    ASSERT_EQ(t.activities.size(), 4u);
    EXPECT_EQ(t.activities[0].device, r);
    EXPECT_EQ(t.activities[0].duration_ns, r == 0 ? 100'000 : 110'000);
    EXPECT_EQ(t.activities[1].stream, 20);
    EXPECT_EQ(t.activities[1].collective, -1);  // no runtime table: no launch, no NCCL range
    ASSERT_EQ(t.steps.size(), 2u);
    EXPECT_EQ(t.steps[0].number, 10);
    EXPECT_TRUE(t.gpu_steps.empty());
    const std::string name = fs::path(t.origin).stem().string();
    const RankTrace fresh = read_nsys_file(make_export(dir, "ranks/" + name + ".sql", name + ".sqlite"));
    ASSERT_EQ(fresh.activities.size(), t.activities.size()) << "regenerate " << t.origin << " from its .sql (tests/data/traces/README.md)";
    for (std::size_t i = 0; i < t.activities.size(); ++i) EXPECT_EQ(fresh.activities[i].duration_ns, t.activities[i].duration_ns);
  }
  EXPECT_TRUE(looks_like_sqlite(kNsys + "ranks"));
  EXPECT_TRUE(looks_like_sqlite(kNsys + "ranks/nodeA-rank1.sqlite"));
  EXPECT_FALSE(looks_like_sqlite(kNsys + "ranks/nodeA-rank1.sql"));
  EXPECT_FALSE(looks_like_sqlite(kNsys));  // SQL scripts only
  EXPECT_FALSE(looks_like_sqlite(kNsys + "no-such-file.sqlite"));
}

TEST(Nsys, BadExportsAreInputErrorsNamingTheFileTableAndColumn) {
  const test::TempDir dir;
  const auto error = [](const std::string& path) { return test::error_of([&] { read_nsys_file(path); }); };
  const std::string text = dir.write("notes.sqlite", "not a database, just text that is long enough to have a header\n");
  const std::string not_sqlite = error(text);
  EXPECT_NE(not_sqlite.find("notes.sqlite"), std::string::npos) << not_sqlite;
  EXPECT_NE(not_sqlite.find("not an SQLite database"), std::string::npos) << not_sqlite;
  EXPECT_FALSE(looks_like_sqlite(text));

  const std::string no_start = error(make_export(dir, "bad-no-start.sql", "no-start.sqlite"));
  EXPECT_NE(no_start.find("no-start.sqlite: table CUPTI_ACTIVITY_KIND_KERNEL: missing column 'start'"), std::string::npos) << no_start;

  // Truncated: the header promises pages the file no longer has.
  const std::string whole = make_export(dir, "nsys-current.sql", "whole.sqlite");
  for (const std::uintmax_t size : {std::uintmax_t{4096}, fs::file_size(whole) / 2}) {
    const std::string cut = (dir.path() / ("cut-" + std::to_string(size) + ".sqlite")).string();
    fs::copy_file(whole, cut);
    fs::resize_file(cut, size);
    EXPECT_TRUE(looks_like_sqlite(cut));
    const std::string truncated = error(cut);
    EXPECT_NE(truncated.find(cut + ": "), std::string::npos) << truncated;
    EXPECT_NE(truncated.find("SQLite's error"), std::string::npos) << truncated;
  }

  // A kernel whose name id is not in StringIds; an end before the start: the row and the column.
  const std::string ids = make_export(dir, "nsys-legacy.sql", "bad-id.sqlite");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(ids.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 99 WHERE rowid = 2;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  const std::string bad_id = error(ids);
  EXPECT_NE(bad_id.find("table CUPTI_ACTIVITY_KIND_KERNEL row 2: column 'demangledName': expected an id of table StringIds, got 99"),
            std::string::npos)
      << bad_id;
  const std::string times = make_export(dir, "nsys-legacy.sql", "bad-end.sqlite");
  ASSERT_EQ(sqlite3_open(times.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET end = 5 WHERE rowid = 1;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  const std::string bad_end = error(times);
  EXPECT_NE(bad_end.find("table CUPTI_ACTIVITY_KIND_MEMCPY row 1: column 'end'"), std::string::npos) << bad_end;

  EXPECT_NE(error((dir.path() / "missing.sqlite").string()).find("missing.sqlite"), std::string::npos);
  EXPECT_NE(test::error_of([&] { read_nsys(kNsys); }).find("*.sqlite"), std::string::npos);  // a directory of scripts only
}

// A simulated step of one GPU against the current-schema export: every GPU work of a step is counted in it, the
// all-reduce and the D2H copy that run after their host step too, and the warm-up copy in none.
TEST(Nsys, ComparedWithASimulatedStepPerClassWithTheGpusProjectedSteps) {
  const test::TempDir dir;
  const std::vector<RankTrace> ranks = {read_nsys_file(make_export(dir, "nsys-current.sql", "current.sqlite"))};
  sim::Timeline predicted;
  predicted.origin = "predicted";
  predicted.step_ns = 900'000;
  predicted.process_names[0] = "gpu0";
  predicted.stream_names[{0, 0}] = "compute0";
  predicted.stream_names[{0, 1}] = "comm";
  predicted.slices.push_back({"L0 gemm", 0, 0, "gemm", 0, 90'000, 0});
  predicted.slices.push_back({"dp all-reduce", 0, 1, "collective", 90'000, 350'000, 16 << 20});
  const KernelClassifier classes;
  const EngineComparison c = compare_with_engine(predicted, ranks, classes);
  EXPECT_EQ(c.measured_ranks, 1);
  EXPECT_EQ(c.measured_steps, 2);
  EXPECT_TRUE(c.steps_annotated);
  // The GPU's steps (engine_compare: each from its first work to the next one's, the last to the end of the work):
  // #3 from 2.1 ms to 3.1 ms, #4 from 3.1 ms to 4.22 ms.
  EXPECT_EQ(c.step.measured_ns, 1'060'000);
  const auto row = [&](const std::string& what) {
    for (const auto& r : c.by_class) {
      if (r.what == what) return r;
    }
    ADD_FAILURE() << what;
    return sim::ComparisonRow{};
  };
  EXPECT_EQ(row("gemm").measured_ns, 100'000);
  EXPECT_EQ(row("gemm").measured_count, 1);
  EXPECT_EQ(row("attention fwd").measured_ns, 150'000);
  EXPECT_EQ(row("elementwise").measured_ns, 32'000);  // the add, the DtoD copy and the memset
  EXPECT_EQ(row("elementwise").measured_count, 3);
  EXPECT_EQ(row("collective").measured_ns, 400'000);
  EXPECT_EQ(row("H2D").measured_ns, 40'000);
  EXPECT_EQ(row("D2H").measured_ns, 20'000);  // step #4's ends at 4.22 ms, after every host step
  EXPECT_EQ(row("p2p").measured_ns, 10'000);  // one in two steps
  EXPECT_EQ(row(kUnclassified).measured_ns, 5'000);
  ASSERT_EQ(c.unclassified.size(), 1u);
  EXPECT_EQ(c.unclassified[0].name, "my_custom_kernel");
  // The trace's all-reduce is the plan's size: no contradiction about sizes; a plan of 8 MiB has one.
  for (const auto& s : c.contradictions) EXPECT_EQ(s.find("a size no collective"), std::string::npos) << s;
  predicted.slices[1].bytes = 8 << 20;
  const EngineComparison d = compare_with_engine(predicted, ranks, classes);
  bool size_named = false;
  for (const auto& s : d.contradictions) size_named = size_named || s.find("allreduce of 16.0 MiB") != std::string::npos;
  EXPECT_TRUE(size_named);
}

}  // namespace
}  // namespace trainyard::traces
