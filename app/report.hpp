#pragma once
// How `list` and `show` present profiles and models: as JSON (--json) and as text for people; and the Chrome
// trace flags of plan, simulate and run.
#include <optional>
#include <ostream>
#include <string>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "hwprofiles/node.hpp"
#include "models/model.hpp"
#include "sim/report.hpp"

namespace trainyard::app {

struct ModelReportOptions {
  std::int64_t seq_len = 4096;
  model::PrecisionPolicy precision;
  const hw::NodeProfile* hw = nullptr;  // when given, model states are set against this hardware
  int nodes = 1;
};

nlohmann::json gpu_json(const hw::GpuProfile& gpu);
nlohmann::json node_json(const hw::NodeProfile& node, int nodes);
nlohmann::json model_json(const model::ModelConfig& model, const ModelReportOptions& options);

void print_gpu(std::ostream& out, const hw::GpuProfile& gpu);
void print_node(std::ostream& out, const hw::NodeProfile& node, int nodes);
void print_model(std::ostream& out, const model::ModelConfig& model, const ModelReportOptions& options);

// --trace-gpus, --trace-window, --trace-counters: which part of the step a --trace file keeps.
void add_trace_options(boost::program_options::options_description& options);

// A --trace request, checked before any work. A 1M-token step has millions of slices, too many for Perfetto to
// open: without flags a large step's trace is cut down (resolve_selection), and stderr says how.
struct TraceRequest {
  std::string path;
  sim::TraceSelection selection;
  bool gpus_given = false;      // --trace-gpus: else chosen by size when written
  bool window_given = false;    // --trace-window
  bool counters_given = false;  // --trace-counters
};
// nullopt without --trace (the trace flags alone are an InputError). Every flag is checked against `gpus`.
std::optional<TraceRequest> trace_request(const boost::program_options::variables_map& vm, int gpus);
// The selection a request gets for this result, as write_trace writes it. Without --trace-gpus: the whole step when
// its trace stays under 40 MB; else GPU 0 with its host; else also without counters (unless --trace-counters was
// given); else the first part of the step that fits (unless --trace-window was given). `note` says what was left out.
struct ResolvedTrace {
  sim::TraceSelection selection;
  std::string note;
};
ResolvedTrace resolve_selection(const TraceRequest& request, const sim::SimResult& result, const sim::TaskGraph& graph, const sim::Cluster& cluster);
// Writes the trace and says on stderr which part of the step it holds.
void write_trace(const TraceRequest& request, const sim::SimResult& result, const sim::TaskGraph& graph, const sim::Cluster& cluster,
                 std::string_view source = "simulated");

}  // namespace trainyard::app
