#include "app/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>

#include "common/error.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"
#include "hwprofiles/topology.hpp"

namespace trainyard::app {

using Json = nlohmann::json;

namespace {

Json figure_json(const hw::Figure& f) {
  Json out = {{"value", f.value},
              {"source", {{"id", f.source_id}, {"kind", trainyard::json::to_string(f.source.kind)}, {"detail", f.source.describe()}}}};
  if (!f.note.empty()) out["note"] = f.note;
  return out;
}

// Every figure of a GPU profile with its source, for the text table.
void add_figure(TextTable& table, const std::string& name, const hw::Figure& f, const std::string& shown) {
  table.add_row({name, shown, std::string(trainyard::json::to_string(f.source.kind)) + " [" + f.source_id + "]"});
}

// The GPUs and NICs below each PCIe switch: they share its uplink to the CPU.
std::map<std::string, std::vector<std::string>> devices_by_switch(const hw::NodeProfile& node) {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& l : node.links) {
    if (l.type != hw::LinkType::pcie) continue;
    const auto* a = node.find_vertex(l.a);
    const auto* b = node.find_vertex(l.b);
    if (b->type == hw::VertexType::pcie_switch && (a->type == hw::VertexType::gpu || a->type == hw::VertexType::nic)) {
      out[l.b].push_back(l.a);
    } else if (a->type == hw::VertexType::pcie_switch && (b->type == hw::VertexType::gpu || b->type == hw::VertexType::nic)) {
      out[l.a].push_back(l.b);
    }
  }
  return out;
}

}  // namespace

Json gpu_json(const hw::GpuProfile& gpu) {
  Json peaks = Json::object();
  for (hw::Dtype d : hw::kAllDtypes) peaks[std::string(hw::to_string(d))] = figure_json(gpu.peak_dense_tflops[int(d)]);
  return {
      {"kind", "gpu"},
      {"name", gpu.name},
      {"description", gpu.description},
      {"origin", gpu.origin},
      {"peak_dense_tflops", peaks},
      {"hbm_bytes", figure_json(gpu.hbm_bytes)},
      {"hbm_GBps", figure_json(gpu.hbm_GBps)},
      {"sm_count", figure_json(gpu.sm_count)},
      {"pcie_generation", figure_json(gpu.pcie_generation)},
      {"pcie_lanes", figure_json(gpu.pcie_lanes)},
      {"nvlink_GBps_per_direction", figure_json(gpu.nvlink_GBps_per_direction)},
      {"sustained",
       {{"gemm_efficiency", figure_json(gpu.sustained.gemm_efficiency)},
        {"hbm_efficiency", figure_json(gpu.sustained.hbm_efficiency)},
        {"pcie_h2d_GBps", figure_json(gpu.sustained.pcie_h2d_GBps)},
        {"pcie_d2h_GBps", figure_json(gpu.sustained.pcie_d2h_GBps)},
        {"nvlink_GBps_per_direction", figure_json(gpu.sustained.nvlink_GBps_per_direction)}}},
      {"derived",
       {{"bf16_peak_tflops", gpu.peak_tflops(hw::Dtype::bf16)},
        {"pcie_raw_GBps_per_direction", gpu.pcie_raw_GBps_per_direction()},
        {"ridge_flop_per_byte_bf16", gpu.ridge_flop_per_byte(hw::Dtype::bf16)}}},
  };
}

void print_gpu(std::ostream& out, const hw::GpuProfile& gpu) {
  out << gpu.name << ": " << gpu.description << "\n(from " << gpu.origin << ")\n\n";
  TextTable table({"figure", "value", "source"});
  for (hw::Dtype d : hw::kAllDtypes) {
    const auto& f = gpu.peak_dense_tflops[int(d)];
    add_figure(table, "peak dense " + std::string(hw::to_string(d)), f, format_fixed(f.value, 1) + " TFLOP/s");
  }
  add_figure(table, "HBM capacity", gpu.hbm_bytes, format_bytes(gpu.hbm_bytes.value));
  add_figure(table, "HBM bandwidth", gpu.hbm_GBps, format_fixed(gpu.hbm_GBps.value, 0) + " GB/s");
  add_figure(table, "SMs", gpu.sm_count, format_number(gpu.sm_count.value));
  add_figure(table, "PCIe", gpu.pcie_generation, "Gen" + format_number(gpu.pcie_generation.value) + " x" + format_number(gpu.pcie_lanes.value));
  add_figure(table, "NVLink per direction", gpu.nvlink_GBps_per_direction,
             gpu.nvlink_GBps_per_direction.value > 0 ? format_fixed(gpu.nvlink_GBps_per_direction.value, 0) + " GB/s" : "none");
  add_figure(table, "sustained GEMM", gpu.sustained.gemm_efficiency, format_fixed(100 * gpu.sustained.gemm_efficiency.value, 0) + "% of bf16 peak");
  add_figure(table, "sustained HBM", gpu.sustained.hbm_efficiency, format_fixed(100 * gpu.sustained.hbm_efficiency.value, 0) + "% of HBM bandwidth");
  add_figure(table, "sustained H2D (pinned)", gpu.sustained.pcie_h2d_GBps, format_fixed(gpu.sustained.pcie_h2d_GBps.value, 1) + " GB/s");
  add_figure(table, "sustained D2H (pinned)", gpu.sustained.pcie_d2h_GBps, format_fixed(gpu.sustained.pcie_d2h_GBps.value, 1) + " GB/s");
  if (gpu.sustained.nvlink_GBps_per_direction.value > 0) {
    add_figure(table, "NVLink data rate", gpu.sustained.nvlink_GBps_per_direction,
               format_fixed(gpu.sustained.nvlink_GBps_per_direction.value, 1) + " GB/s per direction (simulated)");
  }
  table.print(out);
  out << "\nderived\n"
      << "  bf16 dense peak      " << format_fixed(gpu.peak_tflops(hw::Dtype::bf16), 1) << " TFLOP/s\n"
      << "  PCIe per direction   " << format_fixed(gpu.pcie_raw_GBps_per_direction(), 1) << " GB/s raw\n"
      << "  ridge point (bf16)   " << format_fixed(gpu.ridge_flop_per_byte(hw::Dtype::bf16), 0) << " FLOP/byte of HBM traffic\n";
}

Json node_json(const hw::NodeProfile& node, int nodes) {
  Json vertices = Json::array();
  for (const auto& v : node.vertices) {
    Json j = {{"id", v.id}, {"type", hw::to_string(v.type)}};
    if (v.nic_GBps_per_direction) j["GBps_per_direction"] = figure_json(*v.nic_GBps_per_direction);
    vertices.push_back(j);
  }
  Json links = Json::array();
  for (const auto& l : node.links) {
    Json j = {{"a", l.a}, {"b", l.b}, {"type", hw::to_string(l.type)}, {"GBps_per_direction", l.GBps_per_direction}, {"full_duplex", l.full_duplex}};
    if (l.type == hw::LinkType::pcie) {
      j["generation"] = l.pcie_generation;
      j["lanes"] = l.pcie_lanes;
    }
    links.push_back(j);
  }
  hw::Topology topo(node, 1);
  const auto gpu0 = topo.gpu(0, 0);
  const auto host_route = topo.route(gpu0, *topo.nearest_host_memory(gpu0));
  const int gpus = node.gpu_count() * nodes;
  return {
      {"kind", "node"},
      {"name", node.name},
      {"description", node.description},
      {"origin", node.origin},
      {"gpu", gpu_json(node.gpu)},
      {"gpus_per_node", node.gpu_count()},
      {"host_dram_bytes", figure_json(node.host_dram_bytes)},
      {"pcie_peer_to_peer", node.pcie_peer_to_peer},
      {"topology", {{"vertices", vertices}, {"links", links}}},
      {"derived",
       {{"host_dram_GBps", node.host_dram_GBps()},
        {"nic_GBps_per_gpu", node.nic_GBps_per_gpu()},
        {"gpu0_to_host_route", topo.describe(host_route)},
        {"gpu0_to_host_bottleneck_GBps", host_route.bottleneck_GBps}}},
      {"cluster",
       {{"nodes", nodes},
        {"gpus", gpus},
        {"bf16_peak_tflops", gpus * node.gpu.peak_tflops(hw::Dtype::bf16)},
        {"hbm_bytes", gpus * node.gpu.hbm_bytes.value},
        {"host_dram_bytes", nodes * node.host_dram_bytes.value}}},
  };
}

void print_node(std::ostream& out, const hw::NodeProfile& node, int nodes) {
  const auto& gpu = node.gpu;
  const int n = node.gpu_count();
  out << node.name << ": " << node.description << "\n(from " << node.origin << ")\n\n";
  TextTable table({"figure", "value"});
  table.add_row({"GPUs", std::to_string(n) + " x " + gpu.name});
  table.add_row({"bf16 dense peak", format_fixed(gpu.peak_tflops(hw::Dtype::bf16), 1) + " TFLOP/s per GPU, " +
                                        format_fixed(n * gpu.peak_tflops(hw::Dtype::bf16), 0) + " per node"});
  table.add_row({"HBM", format_bytes(gpu.hbm_bytes.value) + " at " + format_fixed(gpu.hbm_GBps.value, 0) + " GB/s per GPU"});
  table.add_row({"ridge point (bf16)", format_fixed(gpu.ridge_flop_per_byte(hw::Dtype::bf16), 0) + " FLOP/byte"});
  table.add_row({"PCIe per GPU", "Gen" + format_number(gpu.pcie_generation.value) + " x" + format_number(gpu.pcie_lanes.value) + ": " +
                                     format_fixed(gpu.pcie_raw_GBps_per_direction(), 1) + " GB/s per direction raw; sustained H2D " +
                                     format_fixed(gpu.sustained.pcie_h2d_GBps.value, 1) + ", D2H " +
                                     format_fixed(gpu.sustained.pcie_d2h_GBps.value, 1) + " GB/s"});
  const bool nvlink = node.count(hw::VertexType::nvswitch) > 0 ||
                      std::any_of(node.links.begin(), node.links.end(), [](const hw::LinkSpec& l) { return l.type == hw::LinkType::nvlink; });
  table.add_row({"NVLink", nvlink ? format_fixed(gpu.nvlink_GBps_per_direction.value, 0) + " GB/s per direction per GPU" +
                                        (node.count(hw::VertexType::nvswitch) ? " (NVSwitch)" : "")
                                  : "none"});
  table.add_row({"PCIe peer-to-peer", node.pcie_peer_to_peer ? "yes" : "no (GPU-to-GPU copies go through host memory)"});
  table.add_row({"host DRAM", format_bytes(node.host_dram_bytes.value) + " at " + format_fixed(node.host_dram_GBps(), 1) + " GB/s (" +
                                  std::to_string(node.count(hw::VertexType::host_memory)) + " socket(s))"});
  const int nics = node.count(hw::VertexType::nic);
  table.add_row({"NICs", nics == 0 ? "none (single node only)"
                                   : std::to_string(nics) + ", " + format_fixed(node.nic_GBps_per_gpu(), 1) + " GB/s per direction per GPU"});
  hw::Topology topo(node, 1);
  const auto gpu0 = topo.gpu(0, 0);
  table.add_row({"gpu0 to host", topo.describe(topo.route(gpu0, *topo.nearest_host_memory(gpu0)))});
  table.print(out);

  const auto by_switch = devices_by_switch(node);
  if (!by_switch.empty()) {
    out << "\nshared PCIe switches (devices below one switch share its uplink)\n";
    for (const auto& [sw, devices] : by_switch) {
      out << "  " << sw << ":";
      for (const auto& d : devices) out << " " << d;
      out << "\n";
    }
  }
  if (nodes > 1) {
    const int gpus = n * nodes;
    out << "\ncluster of " << nodes << " nodes: " << gpus << " GPUs, " << format_fixed(gpus * gpu.peak_tflops(hw::Dtype::bf16) / 1000, 2)
        << " PFLOP/s bf16 dense, " << format_bytes(gpus * gpu.hbm_bytes.value) << " HBM, " << format_bytes(nodes * node.host_dram_bytes.value)
        << " host DRAM\n";
    hw::Topology cluster(node, nodes);
    out << "  inter-node route: " << cluster.describe(cluster.route(cluster.gpu(0, 0), cluster.gpu(1, 0))) << "\n";
  }
}

Json model_json(const model::ModelConfig& m, const ModelReportOptions& options) {
  const auto p = m.param_counts();
  const auto states = model::model_state_bytes(m, options.precision);
  Json out = {
      {"kind", "model"},
      {"name", m.name},
      {"description", m.description},
      {"source", m.source},
      {"origin", m.origin},
      {"layers", m.layers},
      {"hidden", m.hidden},
      {"heads", m.heads},
      {"kv_heads", m.kv_heads},
      {"head_dim", m.head_dim},
      {"ffn_hidden", m.ffn_hidden},
      {"vocab", m.vocab},
      {"activation", model::to_string(m.activation)},
      {"norm", model::to_string(m.norm)},
      {"bias", m.bias},
      {"tied_embeddings", m.tied_embeddings},
      {"dtype", m.dtype},
      {"params",
       {{"total", m.params()},
        {"embedding", p.embedding},
        {"lm_head", p.lm_head},
        {"per_layer", p.per_layer()},
        {"attention_per_layer", p.attention_per_layer},
        {"mlp_per_layer", p.mlp_per_layer}}},
      {"flops_per_token",
       {{"seq_len", options.seq_len},
        {"convention", "multiply-add = 2 FLOPs; training = 3 x forward; causal attention averages kv_len (S+1)/2"},
        {"dense_fwd", m.dense_flops_per_token_fwd()},
        {"attention_fwd_causal", m.attention_flops_per_token_fwd(options.seq_len, true)},
        {"training_causal", m.training_flops_per_token(options.seq_len, true)},
        {"megatron_formula", m.megatron_flops_per_token(options.seq_len)}}},
      {"model_states",
       {{"precision", options.precision.name},
        {"bytes_per_param", options.precision.bytes_per_param()},
        {"weights_bytes", states.weights},
        {"grads_bytes", states.grads},
        {"master_bytes", states.master},
        {"optimizer_bytes", states.optimizer},
        {"total_bytes", states.total()}}},
  };
  if (options.hw != nullptr) {
    const int gpus = options.hw->gpu_count() * options.nodes;
    const double hbm = options.hw->gpu.hbm_bytes.value;
    out["on_hardware"] = {{"hw", options.hw->name},
                          {"nodes", options.nodes},
                          {"gpus", gpus},
                          {"hbm_bytes_per_gpu", hbm},
                          {"replicated_states_fit_hbm", states.total() <= hbm},
                          {"sharded_states_bytes_per_gpu", states.total() / gpus},
                          {"sharded_states_fit_hbm", states.total() / gpus <= hbm},
                          {"states_fit_host_dram", states.total() <= options.nodes * options.hw->host_dram_bytes.value}};
  }
  return out;
}

void print_model(std::ostream& out, const model::ModelConfig& m, const ModelReportOptions& options) {
  const auto p = m.param_counts();
  out << m.name << ": " << m.description << "\n(from " << m.origin << "; shape: " << m.source << ")\n\n";
  TextTable table({"figure", "value"});
  table.add_row({"shape", std::to_string(m.layers) + " layers, hidden " + std::to_string(m.hidden) + ", " + std::to_string(m.heads) + " heads (" +
                              std::to_string(m.kv_heads) + " kv, head_dim " + std::to_string(m.head_dim) + "), ffn " + std::to_string(m.ffn_hidden) +
                              " " + std::string(model::to_string(m.activation)) + ", vocab " + std::to_string(m.vocab)});
  table.add_row({"details", std::string(model::to_string(m.norm)) + (m.bias ? ", biases" : ", no biases") +
                                (m.tied_embeddings ? ", tied embeddings" : ", untied embeddings") + ", " + m.dtype});
  table.add_row({"parameters", format_count(m.params()) + " (embedding " + format_count(p.embedding) + ", LM head " + format_count(p.lm_head) +
                                   ", per layer " + format_count(p.per_layer()) + ")"});
  table.add_row({"dense FLOPs/token",
                 format_flops(m.dense_flops_per_token_fwd()) + " forward, " + format_flops(3 * m.dense_flops_per_token_fwd()) + " training"});
  table.add_row({"attention FLOPs/token", format_flops(m.attention_flops_per_token_fwd(options.seq_len, true)) +
                                              " forward at S=" + format_tokens(options.seq_len) + " (causal)"});
  table.add_row({"training FLOPs/token", format_flops(m.training_flops_per_token(options.seq_len, true)) + " at S=" + format_tokens(options.seq_len) +
                                             " (Megatron formula: " + format_flops(m.megatron_flops_per_token(options.seq_len)) + ")"});
  const auto s = model::model_state_bytes(m, options.precision);
  table.add_row({"model states", format_bytes(s.total()) + " with " + options.precision.name + " (weights " + format_bytes(s.weights) + ", grads " +
                                     format_bytes(s.grads) + ", master " + format_bytes(s.master) + ", Adam " + format_bytes(s.optimizer) + ")"});
  if (options.hw != nullptr) {
    const int gpus = options.hw->gpu_count() * options.nodes;
    const double hbm = options.hw->gpu.hbm_bytes.value;
    table.add_row(
        {"on " + options.hw->name + " x" + std::to_string(options.nodes), std::to_string(gpus) + " GPUs with " + format_bytes(hbm) + " HBM each"});
    table.add_row({"  replicated states", format_bytes(s.total()) + " per GPU: " + (s.total() <= hbm ? "fit" : "do not fit") + " in HBM"});
    table.add_row({"  fully sharded states", format_bytes(s.total() / gpus) + " per GPU: " + (s.total() / gpus <= hbm ? "fit" : "do not fit") +
                                                 " in HBM (before activations)"});
  }
  table.print(out);
  out << "\nFLOPs convention: multiply-add = 2 FLOPs, backward = 2 x forward, causal attention over S tokens "
         "averages (S+1)/2 keys per query; MFU counts these model FLOPs only.\n";
}

// --- Chrome trace flags ------------------------------------------------------------------------------------

namespace po = boost::program_options;

namespace {

// A trace larger than this is cut down by default, so that Perfetto opens it quickly.
constexpr std::int64_t kDefaultTraceBytes = std::int64_t{40} << 20;

std::vector<int> parse_gpu_list(const std::string& text, int gpus) {
  const std::string expected = "all, or a comma list of GPU numbers and ranges below " + std::to_string(gpus) + " (e.g. 0,2-3)";
  std::vector<int> out;
  if (text == "all") return out;
  for (const std::string& item : split_commas(text)) {
    const auto dash = item.find('-', 1);
    auto number = [&](const std::string& digits) {
      if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
        throw InputError("--trace-gpus", "value", expected, "\"" + item + "\"");
      }
      const int g = std::stoi(digits);
      if (g >= gpus) throw InputError("--trace-gpus", "value", expected, "\"" + item + "\" (the step has " + std::to_string(gpus) + " GPUs)");
      return g;
    };
    const int lo = number(item.substr(0, dash)), hi = dash == std::string::npos ? lo : number(item.substr(dash + 1));
    if (hi < lo) throw InputError("--trace-gpus", "value", expected, "\"" + item + "\" (a descending range)");
    for (int g = lo; g <= hi; ++g) out.push_back(g);
  }
  if (out.empty()) throw InputError("--trace-gpus", "value", expected, "\"" + text + "\"");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// "START:END" in milliseconds, either side may be empty: [start, end] in ns (end -1: the end of the step).
std::pair<std::int64_t, std::int64_t> parse_window(const std::string& text) {
  const std::string expected = "START:END in milliseconds, e.g. 0:250 or 100: (either may be empty), START below END";
  const auto colon = text.find(':');
  if (colon == std::string::npos) throw InputError("--trace-window", "value", expected, "\"" + text + "\"");
  auto ms = [&](const std::string& part, std::int64_t none) -> std::int64_t {
    if (part.empty()) return none;
    char* end = nullptr;
    const double v = std::strtod(part.c_str(), &end);
    if (end != part.c_str() + part.size() || !std::isfinite(v) || v < 0 || v > 1e10) {
      throw InputError("--trace-window", "value", expected, "\"" + text + "\"");
    }
    return std::llround(v * 1e6);
  };
  const std::int64_t start = ms(text.substr(0, colon), 0), end = ms(text.substr(colon + 1), -1);
  if (end >= 0 && end <= start) throw InputError("--trace-window", "value", expected, "\"" + text + "\"");
  return {start, end};
}

}  // namespace

void add_trace_options(po::options_description& options) {
  // clang-format off
  options.add_options()
      ("trace-gpus", po::value<std::string>()->value_name("all|LIST"),
       "with --trace: the GPUs whose tracks it keeps, e.g. 0 or 0,4-7 (default: all when the trace is small, else GPU 0)")
      ("trace-window", po::value<std::string>()->value_name("START:END"), "with --trace: only this part of the step, in ms, e.g. 0:250")
      ("trace-counters", po::value<std::string>()->value_name("on|off"), "with --trace: memory and link counter tracks (default on)");
  // clang-format on
}

std::optional<TraceRequest> trace_request(const po::variables_map& vm, int gpus) {
  if (!vm.count("trace")) {
    for (const char* flag : {"trace-gpus", "trace-window", "trace-counters"}) {
      if (vm.count(flag)) throw InputError(std::string("--") + flag, "value", "only with --trace FILE", "no --trace");
    }
    return std::nullopt;
  }
  TraceRequest request;
  request.path = vm["trace"].as<std::string>();
  if (vm.count("trace-gpus")) {
    request.selection.gpus = parse_gpu_list(vm["trace-gpus"].as<std::string>(), gpus);
    request.gpus_given = true;
  }
  if (vm.count("trace-window")) {
    std::tie(request.selection.start_ns, request.selection.end_ns) = parse_window(vm["trace-window"].as<std::string>());
    request.window_given = true;
  }
  if (vm.count("trace-counters")) {
    const std::string v = vm["trace-counters"].as<std::string>();
    if (v != "on" && v != "off") throw InputError("--trace-counters", "value", "on or off", "\"" + v + "\"");
    request.selection.counters = v == "on";
    request.counters_given = true;
  }
  return request;
}

namespace {

std::int64_t total_bytes(const std::vector<sim::TraceEvent>& events) {
  std::int64_t bytes = 0;
  for (const auto& e : events) bytes += e.bytes;
  return bytes;
}

std::string megabytes(std::int64_t bytes) { return format_fixed(static_cast<double>(bytes) / 1e6, 0) + " MB"; }

}  // namespace

ResolvedTrace resolve_selection(const TraceRequest& request, const sim::SimResult& result, const sim::TaskGraph& graph, const sim::Cluster& cluster) {
  ResolvedTrace out{request.selection, ""};
  sim::TraceSelection& sel = out.selection;
  if (request.gpus_given) return out;
  const std::int64_t whole = total_bytes(sim::trace_events(result, graph, cluster, sel));
  if (whole <= kDefaultTraceBytes) return out;
  // Too large to open comfortably: GPU 0 and its host; then without counters; then the first part of the step.
  out.note = "all GPUs would take about " + megabytes(whole) + "; --trace-gpus all writes them";
  sel.gpus = {0};
  if (request.window_given || total_bytes(sim::trace_events(result, graph, cluster, sel)) <= kDefaultTraceBytes) return out;
  if (!request.counters_given) {
    sel.counters = false;
    if (total_bytes(sim::trace_events(result, graph, cluster, sel)) <= kDefaultTraceBytes) {
      out.note += "; its counters are left out (--trace-counters on with a --trace-window writes them)";
      return out;
    }
  }
  std::vector<sim::TraceEvent> events = sim::trace_events(result, graph, cluster, sel);
  std::sort(events.begin(), events.end(), [](const sim::TraceEvent& a, const sim::TraceEvent& b) { return a.time_ns < b.time_ns; });
  std::int64_t bytes = 0;
  for (const auto& e : events) {
    bytes += e.bytes;
    if (bytes > kDefaultTraceBytes) {
      sel.end_ns = std::max<std::int64_t>(sel.start_ns + 1, e.time_ns - 1);
      break;
    }
  }
  out.note += "; GPU 0 alone is cut to the first part of the step (--trace-window START:END picks another)";
  return out;
}

void write_trace(const TraceRequest& request, const sim::SimResult& result, const sim::TaskGraph& graph, const sim::Cluster& cluster,
                 std::string_view source) {
  const ResolvedTrace resolved = resolve_selection(request, result, graph, cluster);
  write_file_atomically(request.path, [&](std::ostream& out) { sim::write_chrome_trace(out, result, graph, cluster, source, resolved.selection); });
  std::cerr << "trace " << request.path << ": " << sim::describe(resolved.selection, result.gpus)
            << (resolved.note.empty() ? "" : " (" + resolved.note + ")") << "\n";
}

}  // namespace trainyard::app
