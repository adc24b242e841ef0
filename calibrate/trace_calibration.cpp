#include "calibrate/trace_calibration.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <tuple>
#include <unordered_map>

#include "common/error.hpp"
#include "common/units.hpp"
#include "sim/collectives.hpp"
#include "sim/cost_model.hpp"

namespace trainyard::backend {

using json::Json;

namespace {

// ---- an op's FLOPs from its recorded shapes ------------------------------------------------------------------

std::string dims_text(const std::vector<std::int64_t>& dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? "," : "") + std::to_string(dims[i]);
  return out + "]";
}

bool positive_dims(const std::vector<std::int64_t>& dims, std::size_t rank) {
  return dims.size() == rank && std::all_of(dims.begin(), dims.end(), [](std::int64_t d) { return d > 0; });
}

// GEMMs: the inputs multiplied, [m,k] x [k,n], or batched [b,m,k] x [b,k,n]; the point's seconds are filled later.
std::optional<TraceGemmPoint> gemm_call(const traces::ShapedOp& op) {
  const bool bias_first = op.name == "aten::addmm" || op.name == "aten::baddbmm";  // (self, mat1, mat2)
  const bool batched = op.name == "aten::bmm" || op.name == "aten::baddbmm";
  const std::size_t a = bias_first ? 1 : 0, rank = batched ? 3 : 2;
  if (op.input_dims.size() < a + 2) return std::nullopt;
  const auto& x = op.input_dims[a];
  const auto& y = op.input_dims[a + 1];
  if (!positive_dims(x, rank) || !positive_dims(y, rank) || x[rank - 1] != y[rank - 2]) return std::nullopt;
  // The profile's curve is of bf16 (and fp16, at the same peak) GEMMs; an fp32, TF32 or fp8 one runs at another.
  if (op.input_types.size() > a && op.input_types[a] != "c10::BFloat16" && op.input_types[a] != "c10::Half") return std::nullopt;
  TraceGemmPoint p;
  p.gemm = sim::Gemm{x[rank - 2], y[rank - 1], x[rank - 1], hw::Dtype::bf16};
  p.batch = batched ? x[0] : 1;
  p.point.shape = op.name + " " + dims_text(x) + "x" + dims_text(y);
  p.point.flops = static_cast<double>(p.batch) * sim::compute_cost(p.gemm).hardware_flops;
  return p;
}

// The SDPA backends' inner ops: the kernel family, which inputs are Q and K, their layout, where is_causal is.
struct AttentionForm {
  const char* name;
  const char* family;  // the profile's attention_kernels entry
  bool backward;
  std::size_t q_input, k_input;
  bool heads_before_sequence;  // [batch, heads, seq, head_dim] (cuDNN) or [batch, seq, heads, head_dim] (flash)
  std::size_t causal_input;    // index into Concrete Inputs
};
constexpr AttentionForm kAttentionForms[] = {
    // Seen in a PyTorch 2.11 trace (H200, 2026-11-28): (query, key, value, attn_bias, cum_seq_q, cum_seq_k, max_q,
    // max_k, compute_log_sumexp, dropout_p, is_causal, ...) and (grad_out, query, key, value, out, logsumexp,
    // philox_seed, philox_offset, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ...).
    {"aten::_cudnn_attention_forward", "cudnn", false, 0, 1, true, 10},
    {"aten::_cudnn_attention_backward", "cudnn", true, 1, 2, true, 14},
    // PyTorch's native_functions.yaml; not yet seen in a trace: (query, key, value, cum_seq_q, cum_seq_k, max_q,
    // max_k, dropout_p, is_causal, ...) and (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
    // max_q, max_k, dropout_p, is_causal, ...). SDPA's flash backend is FlashAttention-2.
    {"aten::_flash_attention_forward", "flash2", false, 0, 1, false, 8},
    {"aten::_flash_attention_backward", "flash2", true, 1, 2, false, 11},
};

std::optional<TraceAttentionPoint> attention_call(const traces::ShapedOp& op) {
  const auto form = std::find_if(std::begin(kAttentionForms), std::end(kAttentionForms), [&](const auto& f) { return op.name == f.name; });
  if (form == std::end(kAttentionForms)) return std::nullopt;
  if (op.input_dims.size() <= form->k_input || op.concrete_inputs.size() <= form->causal_input) return std::nullopt;
  const auto& q = op.input_dims[form->q_input];
  const auto& k = op.input_dims[form->k_input];
  const std::string& causal = op.concrete_inputs[form->causal_input];
  if (!positive_dims(q, 4) || !positive_dims(k, 4) || (causal != "True" && causal != "False")) return std::nullopt;
  const std::size_t heads = form->heads_before_sequence ? 1 : 2, seq = form->heads_before_sequence ? 2 : 1;
  TraceAttentionPoint p;
  p.family = form->family;
  sim::Attention& a = p.attention;
  a.q_len = q[seq];
  a.kv_len = k[seq];
  a.heads = static_cast<std::int32_t>(q[heads]);
  a.kv_heads = static_cast<std::int32_t>(k[heads]);
  a.head_dim = static_cast<std::int32_t>(q[3]);
  a.causal = causal == "True";
  a.backward = form->backward;
  p.batch = q[0];
  p.shape = std::string(a.backward ? "attention bwd " : "attention fwd ") + p.family + " batch " + std::to_string(p.batch) + ", " +
            std::to_string(a.heads) + " heads (" + std::to_string(a.kv_heads) + " K/V) x " + std::to_string(a.head_dim) + ", " +
            std::to_string(a.q_len) + "x" + std::to_string(a.kv_len) + (a.causal ? " causal" : "");
  return p;
}

// ---- points ------------------------------------------------------------------------------------------------

// Kineto's collective names as the simulator's ops; none for point-to-point and the rest.
std::optional<sim::CollectiveOp> collective_op(const std::string& name) {
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("allreduce") || has("all_reduce")) return sim::CollectiveOp::all_reduce;
  if (has("allgather") || has("all_gather")) return sim::CollectiveOp::all_gather;
  if (has("reduce_scatter")) return sim::CollectiveOp::reduce_scatter;
  if (has("all_to_all") || has("alltoall")) return sim::CollectiveOp::all_to_all;
  if (has("broadcast")) return sim::CollectiveOp::broadcast;
  return std::nullopt;
}

// Calls gathered over the ranks, keyed by shape; each shape's point is the median of its calls.
struct Gathered {
  std::map<std::string, std::pair<TraceGemmPoint, std::vector<double>>> gemm;
  std::map<std::string, std::pair<TraceAttentionPoint, std::vector<double>>> attention;
  std::map<std::tuple<std::string, int, double>, std::vector<double>> collectives;  // (name, group, bytes)
  std::map<std::string, std::int64_t> unshaped;                                     // what could not be used, counted
  std::int64_t calls = 0;
};

constexpr const char* kNoDuration = "kernel(s) of no duration";

// One rank: every kernel's seconds summed per External id (an op's kernels), each shaped op a sample of its shape;
// collectives by (name, group, size); the GEMM and attention kernels not tied to a shaped op counted by class.
void add_rank(const traces::RankTrace& rank, const traces::KernelClassifier& classes, Gathered& g) {
  std::unordered_map<std::int64_t, const traces::ShapedOp*> shaped;
  for (const auto& op : rank.shaped_ops) shaped.emplace(op.external_id, &op);
  std::unordered_map<std::int64_t, double> seconds_by_op;
  for (const auto& a : rank.activities) {
    if (a.kind != traces::GpuActivity::Kind::kernel) continue;
    if (a.duration_ns <= 0) {  // a kernel the profiler timed as nothing says nothing about a rate
      ++g.unshaped[kNoDuration];
      continue;
    }
    const double seconds = static_cast<double>(a.duration_ns) * 1e-9;
    if (a.collective >= 0) {
      const auto& c = rank.collectives[static_cast<std::size_t>(a.collective)];
      g.collectives[{c.name, static_cast<int>(c.group_size), static_cast<double>(c.bytes())}].push_back(seconds);
    } else if (a.external_id >= 0 && shaped.count(a.external_id) > 0) {
      seconds_by_op[a.external_id] += seconds;
    } else if (const std::string& cls = classes.classify(rank.names[a.name]); cls == "gemm" || cls.rfind("attention", 0) == 0) {
      ++g.unshaped[cls + " kernel(s) not launched by a shaped op"];
    }
  }
  for (const auto& [id, seconds] : seconds_by_op) {
    const traces::ShapedOp& op = *shaped.at(id);
    if (auto gemm = gemm_call(op); gemm && seconds > 0) {
      auto& entry = g.gemm.try_emplace(gemm->point.shape, *gemm, std::vector<double>()).first->second;
      entry.second.push_back(seconds);
    } else if (auto attention = attention_call(op); attention && seconds > 0) {
      auto& entry = g.attention.try_emplace(attention->shape, *attention, std::vector<double>()).first->second;
      entry.second.push_back(seconds);
    } else {
      ++g.unshaped[op.name + " call(s) whose recorded shapes or types are not understood (or not bf16/fp16)"];
      continue;
    }
    ++g.calls;
  }
}

}  // namespace

TracePoints trace_points(const std::vector<traces::RankTrace>& ranks, const traces::KernelClassifier& classes) {
  return trace_points(traces::each_rank(ranks), classes);
}

TracePoints trace_points(const traces::RankSource& next_rank, const traces::KernelClassifier& classes) {
  TracePoints out;
  Gathered g;
  while (const traces::RankTrace* rank = next_rank()) {
    out.origins.push_back(rank->origin);
    if (out.device_name.empty()) out.device_name = rank->device_name;
    if (!rank->device_name.empty() && rank->device_name != out.device_name) {
      throw InputError(rank->origin, "deviceProperties", "the same GPU as " + out.origins.front() + " (" + out.device_name + ")",
                       "\"" + rank->device_name + "\"");
    }
    add_rank(*rank, classes, g);
  }
  out.calls = g.calls;
  for (auto& [shape, entry] : g.gemm) {
    entry.first.point.seconds = median_of(entry.second);
    out.gemm.push_back(entry.first);
  }
  std::sort(out.gemm.begin(), out.gemm.end(), [](const auto& a, const auto& b) { return a.point.flops < b.point.flops; });
  for (auto& [shape, entry] : g.attention) {
    entry.first.seconds = median_of(entry.second);
    entry.first.calls = static_cast<int>(entry.second.size());
    out.attention.push_back(entry.first);
  }
  for (const auto& [key, seconds] : g.collectives) {
    const auto& [name, group, bytes] = key;
    if (group < 2 || !(bytes > 0) || !collective_op(name)) {
      const char* why = group == 0     ? "no group size recorded"
                        : group < 2    ? "a group of one moves nothing"
                        : !(bytes > 0) ? "no size recorded"
                                       : "not a collective the simulator has";
      out.notes.push_back(std::to_string(seconds.size()) + " " + name + " kernel(s) of " + format_bytes(bytes) + " over " + std::to_string(group) +
                          " GPU(s) not fitted (" + why + ")");
      continue;
    }
    out.collectives.push_back({name, group, bytes, median_of(seconds), static_cast<int>(seconds.size())});
  }
  for (const auto& [what, count] : g.unshaped) {
    const bool timed_nothing = what == kNoDuration;
    out.notes.push_back(std::to_string(count) + " " + what +
                        (timed_nothing ? std::string(" (left out)")
                                       : " (profile with record_shapes=True; ops other than aten::mm/addmm/bmm/baddbmm and the cuDNN and "
                                         "flash SDPA ops are not read)"));
  }
  return out;
}

namespace {

// t = x1 / c + x2 x (overhead / c), least squares on relative error: with the overhead free when the shapes
// differ in their blocks-to-positions ratio (and it comes out >= 0), else held at the base's.
AttentionKernelFit fit_attention_pass(const std::vector<const TraceAttentionPoint*>& series, const hw::AttentionKernel& kernel,
                                      const hw::GpuProfile& gpu) {
  const TraceAttentionPoint& first = *series.front();
  const auto& pass = first.attention.backward ? kernel.backward : kernel.forward;
  const double block = kernel.block_queries.value, peak = gpu.peak_tflops(hw::Dtype::bf16) * 1e12;
  std::vector<std::array<double, 3>> rows;  // x1, x2, t
  for (const auto* p : series) {
    const sim::Attention& a = p->attention;
    const sim::AttentionBlockWork work = sim::attention_block_work(a, block);
    const double unit = block * a.heads * 4.0 * a.head_dim * (a.backward ? 2.5 : 1.0) * static_cast<double>(p->batch) / peak;
    rows.push_back({unit * work.key_positions * a.density, unit * work.blocks, p->seconds});
  }
  AttentionKernelFit f;
  f.family = first.family;
  f.backward = first.attention.backward;
  f.head_dim = first.attention.head_dim;
  f.base_ceiling = pass.ceiling(f.head_dim);
  f.points = rows.size();
  // Two unknowns a = 1/c, b = overhead/c: normal equations of the relative residuals (x1 a + x2 b) / t - 1.
  double s11 = 0, s12 = 0, s22 = 0, r1 = 0, r2 = 0;
  for (const auto& [x1, x2, t] : rows) {
    s11 += x1 * x1 / (t * t), s12 += x1 * x2 / (t * t), s22 += x2 * x2 / (t * t), r1 += x1 / t, r2 += x2 / t;
  }
  const double det = s11 * s22 - s12 * s12;
  double a = 0, b = -1;
  if (rows.size() >= 2 && det > 1e-9 * s11 * s22) a = (r1 * s22 - r2 * s12) / det, b = (s11 * r2 - s12 * r1) / det;
  if (b >= 0 && a > 0) {
    f.overhead_fitted = true;
    f.block_overhead_keys = b / a;
  } else {
    f.block_overhead_keys = pass.block_overhead_keys.value;
    double num = 0, den = 0;  // a alone, z = x1 + x2 x overhead
    for (const auto& [x1, x2, t] : rows) {
      const double z = x1 + x2 * f.block_overhead_keys;
      num += z / t, den += z * z / (t * t);
    }
    a = num / den;
  }
  f.ceiling = 1 / a;
  double sum = 0;
  for (const auto& [x1, x2, t] : rows) sum += std::pow(a * (x1 + x2 * f.block_overhead_keys) / t - 1, 2);
  f.rms_relative_error = std::sqrt(sum / static_cast<double>(rows.size()));
  return f;
}

std::string describe_attention_fit(const AttentionKernelFit& f) {
  return f.family + (f.backward ? " backward" : " forward") + " at head_dim " + std::to_string(f.head_dim) + " from " + std::to_string(f.points) +
         " shape(s): ceiling " + format_fixed(f.ceiling, 4) + " of the bf16 peak (the base's " + format_fixed(f.base_ceiling, 4) +
         "), block overhead " + format_fixed(f.block_overhead_keys, 1) + " key positions" +
         (f.overhead_fitted ? " (fitted)" : " (the base's: one shape, or the fit's was negative)") +
         ", t = block x (key positions + blocks x overhead) x heads x 4 x head_dim" + (f.backward ? " x 2.5" : "") +
         " / (peak x ceiling) by least squares on relative error, rms error " + format_fixed(100 * f.rms_relative_error, 1) + "%";
}

// GEMMs: the sweep's curve fit on e / wave efficiency (the simulator multiplies the table by it).
void fit_gemm(const TracePoints& points, const hw::GpuProfile& base, TraceFits& fits) {
  const double peak = base.peak_tflops(hw::Dtype::bf16) * 1e12;
  std::vector<std::pair<double, double>> pairs;
  std::vector<double> distinct;
  for (const auto& p : points.gemm) {
    const double wave = p.batch == 1 ? sim::gemm_wave_efficiency(p.gemm, base) : 1.0;
    pairs.emplace_back(p.point.flops, p.point.flops / (peak * p.point.seconds * wave));
    distinct.push_back(p.point.flops);
  }
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (pairs.size() < 4 || distinct.size() < 3) {
    fits.notes.push_back("gemm: " + std::to_string(pairs.size()) +
                         " shape(s) in the traces, at least 4 over 3 FLOP counts needed: the base's curve kept");
    return;
  }
  const auto above = std::count_if(pairs.begin(), pairs.end(), [](const auto& p) { return p.second > 1; });
  if (above > 0) fits.warnings.push_back("gemm: " + std::to_string(above) + " point(s) above the profile's bf16 peak (table clipped at 1)");
  fits.gemm = fit_saturating(pairs, "gemm");
  fits.gemm_efficiency = std::min(1.0, fits.gemm->curve.at(distinct.back()));
}

// Attention: one fit per kernel family, pass and head_dim the traces hold.
void fit_attention(const TracePoints& points, const hw::GpuProfile& base, TraceFits& fits) {
  std::map<std::tuple<std::string, bool, int>, std::vector<const TraceAttentionPoint*>> series;
  for (const auto& p : points.attention) series[{p.family, p.attention.backward, p.attention.head_dim}].push_back(&p);
  for (const auto& [key, members] : series) {
    const auto& [family, backward, head_dim] = key;
    const auto kernel = base.sustained.attention_kernels.find(family);
    if (kernel == base.sustained.attention_kernels.end()) {
      fits.notes.push_back(family + " attention: the base profile " + base.name + " has no such kernel family (attention_kernels." + family +
                           "): not fitted");
      continue;
    }
    fits.attention.push_back(fit_attention_pass(members, kernel->second, base));
    const AttentionKernelFit& f = fits.attention.back();
    if (f.ceiling > 1) {
      fits.warnings.push_back(f.family + (f.backward ? " backward" : " forward") + " at head_dim " + std::to_string(f.head_dim) + ": ceiling " +
                              format_fixed(f.ceiling, 3) + " of the bf16 peak (table clipped at 1)");
    }
  }
}

// Collectives: the GPUs' NVLink where the base profile has it (a group inside a node), else its PCIe link.
void fit_collectives(const TracePoints& points, const hw::GpuProfile& base, TraceFits& fits) {
  const bool nvlink = base.nvlink_data_GBps() > 0;
  fits.link_GBps = nvlink ? base.nvlink_data_GBps() : base.pcie_raw_GBps_per_direction();
  fits.link = nvlink ? "NVLink, " + format_fixed(fits.link_GBps, 1) + " GB/s per direction (a group inside one node)"
                     : "PCIe, " + format_fixed(fits.link_GBps, 1) + " GB/s per direction";
  std::vector<CollectiveRow> rows;
  for (const auto& c : points.collectives) {
    const std::optional<sim::CollectiveOp> op = collective_op(c.collective);
    if (!op || c.group_size < 2 || !(c.seconds > 0)) continue;  // trace_points keeps none of these; a hand-made point may
    const auto bytes = static_cast<std::int64_t>(c.bytes);
    rows.push_back({static_cast<double>(sim::collective_steps(*op, sim::Algorithm::ring, c.group_size)),
                    sim::bytes_sent_per_rank(*op, sim::Algorithm::ring, c.group_size, bytes) / (fits.link_GBps * 1e9), c.seconds});
  }
  if (rows.size() >= 3) {
    fits.collectives = fit_collective_costs(rows, points.origins.empty() ? "--from-trace" : points.origins.front(), "collective kernels");
    fits.warnings.insert(fits.warnings.end(), fits.collectives->warnings.begin(), fits.collectives->warnings.end());
  } else if (!rows.empty()) {
    fits.notes.push_back("collectives: " + std::to_string(rows.size()) + " size(s) in the traces, 3 needed: no collective library written");
  }
}

}  // namespace

TraceFits fit_trace(const TracePoints& points, const hw::GpuProfile& base) {
  TraceFits fits;
  fits.notes = points.notes;
  fit_gemm(points, base, fits);
  fit_attention(points, base, fits);
  fit_collectives(points, base, fits);
  if (!fits.gemm && fits.attention.empty() && !fits.collectives) {
    throw InputError(points.origins.empty() ? std::string("--from-trace") : points.origins.front(), "traceEvents",
                     "GEMM or attention kernels with their ops' recorded shapes (PyTorch profiler with record_shapes=True), or NCCL "
                     "collectives of 3 sizes or more",
                     std::to_string(points.calls) + " shaped call(s) and " + std::to_string(points.collectives.size()) + " collective size(s)");
  }
  return fits;
}

namespace {

std::string traces_text(const TracePoints& points) {
  std::string out;
  for (std::size_t i = 0; i < points.origins.size() && i < 4; ++i)
    out += (i ? ", " : "") + std::filesystem::path(points.origins[i]).filename().string();
  if (points.origins.size() > 4) out += " and " + std::to_string(points.origins.size() - 4) + " more";
  return out;
}

Json collective_points_json(const TracePoints& points) {
  Json out = Json::array();
  for (const auto& c : points.collectives) {
    const std::optional<sim::CollectiveOp> op = collective_op(c.collective);
    if (!op || c.group_size < 2) continue;
    const double sent = sim::bytes_sent_per_rank(*op, sim::Algorithm::ring, c.group_size, static_cast<std::int64_t>(c.bytes));
    out.push_back({{"collective", c.collective},
                   {"group_size", c.group_size},
                   {"bytes", c.bytes},
                   {"seconds", c.seconds},
                   {"calls", c.calls},
                   {"busbw_GBps", sent / c.seconds * 1e-9},    // nccl-tests' bus bandwidth: what one rank sends per second
                   {"busbw_gbps", sent / c.seconds * 1e-9}});  // the old spelling, kept for one release (docs/taskgraph.md, "Renamed keys")
  }
  return out;
}

Json attention_points_json(const TracePoints& points) {
  Json out = Json::array();
  for (const auto& p : points.attention) {
    const double flops = static_cast<double>(p.batch) * sim::compute_cost(p.attention).hardware_flops;
    out.push_back({{"shape", p.shape}, {"flops", flops}, {"seconds", p.seconds}, {"calls", p.calls}, {"tflops", flops / p.seconds * 1e-12}});
  }
  return out;
}

Json gemm_points_json(const TracePoints& points) {
  std::vector<KernelPoint> kernel_points;
  for (const auto& p : points.gemm) kernel_points.push_back(p.point);
  return kernel_points_json(kernel_points);
}

// A kernel family's pass from its fits (one per traced head_dim): each fitted head_dim's ceiling, the others scaled
// by the fits' mean ratio to the base; the block overhead of the fit with the most shapes where it was fitted.
void write_attention_pass(Json& doc, const std::vector<const AttentionKernelFit*>& fitted, const Json& source) {
  const AttentionKernelFit& first = *fitted.front();
  const std::string id = "trace_attention_" + first.family + (first.backward ? "_bwd" : "_fwd");
  Json& pass = doc["sustained"]["attention_kernels"][first.family][first.backward ? "backward" : "forward"];
  std::map<double, double> ceilings;  // head_dim -> ceiling
  double ratio = 0;
  for (const auto* f : fitted) ratio += f->ceiling / f->base_ceiling / static_cast<double>(fitted.size());
  for (const auto& point : pass["ceiling_by_head_dim"]) ceilings[point[0].get<double>()] = point[1].get<double>() * ratio;
  for (const auto* f : fitted) ceilings[f->head_dim] = f->ceiling;
  Json table = Json::array();
  for (const auto& [head_dim, ceiling] : ceilings) table.push_back({head_dim, std::min(1.0, ceiling)});
  pass["ceiling_by_head_dim"] = table;
  pass["source"] = id;
  const auto most = std::max_element(fitted.begin(), fitted.end(), [](const auto* a, const auto* b) { return a->points < b->points; });
  if ((*most)->overhead_fitted) pass["block_overhead_keys"] = {{"value", (*most)->block_overhead_keys}, {"source", id}};
  doc["sources"][id] = source;
}

}  // namespace

Json trace_calibrated_profile(const Json& base_document, const std::string& name, const TracePoints& points, const TraceFits& fits,
                              const std::string& command) {
  Json doc = base_document;
  const std::string date = utc_now().substr(0, 10);
  const std::string device = points.device_name.empty() ? "the GPU the traces were taken on (not recorded)" : points.device_name;
  const double peak_tflops = doc["peak_dense_tflops"]["bf16"]["value"].get<double>();
  const std::string basis =
      "kernel durations in the PyTorch profiler trace(s) " + traces_text(points) +
      ", each call the sum of its op's kernels (joined by External id), its work from the op's recorded shapes; " +
      "one point per shape, the median of its calls; no launch cost subtracted (the simulator adds kernel_launch_ns for the gap between kernels)";
  if (fits.gemm) {
    doc["sources"]["trace_gemm"] = measured_source(
        date, command, device,
        std::to_string(points.gemm.size()) + " GEMM shapes of " + format_flops(points.gemm.front().point.flops) + " to " +
            format_flops(points.gemm.back().point.flops) + ": " + basis + "; e = FLOPs / (bf16 peak " + format_fixed(peak_tflops, 1) +
            " TFLOP/s x kernel time x the GEMM's wave efficiency); " + describe_curve(*fits.gemm) + kCurveTableBasis);
    doc["sustained"]["efficiency_by_flops"]["gemm"] = {{"source", "trace_gemm"}, {"points", efficiency_table_json(*fits.gemm)}};
    doc["sustained"]["gemm_efficiency"] = {
        {"value", fits.gemm_efficiency},
        {"source", "trace_gemm"},
        {"note", "the fitted GEMM curve at the largest GEMM in the traces; its ceiling e_max is " + format_fixed(fits.gemm->curve.e_max, 3)}};
  }
  std::map<std::pair<std::string, bool>, std::vector<const AttentionKernelFit*>> passes;  // (family, backward)
  for (const auto& f : fits.attention) passes[{f.family, f.backward}].push_back(&f);
  for (const auto& [key, fitted] : passes) {
    std::string described;
    for (const auto* f : fitted) described += (described.empty() ? "" : "; ") + describe_attention_fit(*f);
    write_attention_pass(doc, fitted,
                         measured_source(date, command, device,
                                         described + (fitted.size() > 1 ? "; the block overhead is the fit's with the most shapes" : "") +
                                             "; head_dims not traced scaled by the mean ratio to the base: " + basis));
  }
  doc["name"] = name;
  doc["description"] = doc["description"].get<std::string>() + ", calibrated from profiler traces of " + device + " " + date;
  Json attention_fits = Json::array();
  for (const auto& f : fits.attention) {
    attention_fits.push_back({{"family", f.family},
                              {"pass", f.backward ? "backward" : "forward"},
                              {"head_dim", f.head_dim},
                              {"ceiling", f.ceiling},
                              {"base_ceiling", f.base_ceiling},
                              {"block_overhead_keys", f.block_overhead_keys},
                              {"overhead_fitted", f.overhead_fitted},
                              {"rms_relative_error", f.rms_relative_error},
                              {"points", f.points}});
  }
  doc["calibration"] = {
      {"tool", "trainyard calibrate --from-trace"},
      {"command", command},
      {"started_utc", utc_now()},
      {"traces", points.origins},
      {"device", {{"name", points.device_name}}},
      {"method", basis},
      {"notes", fits.notes},
      {"warnings", fits.warnings},
      {"points", {{"gemm", gemm_points_json(points)}, {"attention", attention_points_json(points)}, {"collectives", collective_points_json(points)}}},
      {"fits", {{"gemm", fits.gemm ? saturating_json(*fits.gemm, 0) : Json()}, {"attention", attention_fits}}}};
  drop_unreferenced_sources(doc);
  return doc;
}

Json trace_collective_library(const std::string& name, const TracePoints& points, const TraceFits& fits, const std::string& command) {
  TRAINYARD_CHECK(fits.collectives.has_value(), "a collective library without a collective fit");
  const CollectiveCostFit& f = *fits.collectives;
  const Json step = {{"value", f.step_s * 1e6}, {"source", "trace_collectives"}};
  const Json base = {{"value", f.base_s * 1e6}, {"source", "trace_collectives"}};
  const Json by_link = {{"nvlink", step}, {"pcie", step}, {"network", step}};
  const std::string basis = "NCCL kernels' durations and metadata (collective, size, group size) in the PyTorch profiler trace(s) " +
                            traces_text(points) + ", " + std::to_string(f.points) + " sizes, the median of each; t = base + steps x step + " +
                            "bytes sent / (efficiency x " + fits.link + ") over the simulator's ring, least squares on relative error: base " +
                            format_fixed(f.base_s * 1e6, 2) + " us, step " + format_fixed(f.step_s * 1e6, 2) + " us, efficiency " +
                            format_fixed(f.efficiency, 3) + ", rms error " + format_fixed(100 * f.rms_relative_error, 1) + "%";
  return {{"schema", "trainyard.collectives.v1"},
          {"name", name},
          {"description",
           "collectives as the traced run's NCCL ran them, one protocol fitted from its kernels; the same step latency on every link class"},
          {"sources", {{"trace_collectives", measured_source(utc_now().substr(0, 10), command, points.device_name, basis)}}},
          {"protocols", Json::array({{{"name", "trace"},
                                      {"efficiency", {{"value", f.efficiency}, {"source", "trace_collectives"}}},
                                      {"base_latency_us", {{"ring", base}, {"tree", base}}},
                                      {"step_latency_us", {{"ring", by_link}, {"tree", by_link}}}}})}};
}

std::string trace_library_path(const std::string& gpu_out) { return path_beside(gpu_out, "-collectives.json"); }

}  // namespace trainyard::backend
