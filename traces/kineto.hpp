#pragma once
// PyTorch profiler (Kineto) Chrome traces, as Megatron-LM, DeepSpeed and torchtitan write them: one file per rank,
// plain or gzip, read as a stream (a SAX parse over zlib) so that a trace of gigabytes takes memory for its GPU
// activity only. Both layouts are read: PyTorch 2.x (cat "kernel", "gpu_memcpy", "gpu_memset", "user_annotation",
// ts in microseconds with decimals) and 1.x (cat "Kernel", "Memcpy", "Memset", "Operator", tid "stream 7").
//
// Kept: GPU kernels, copies and memsets (device = pid, stream = tid, as Kineto writes GPU events), the
// ProfilerStep#N annotations (the steps, on the host and, where recorded, on the GPU), the collectives' metadata (NCCL kernels' own args since 2023,
// or the record_param_comms op they share an External id with), and distributedInfo's rank. Everything else is skipped.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace trainyard::traces {

// One collective's metadata (torch/csrc/profiler/util.h's keys: "Collective name", "In msg nelems", ...).
struct CollectiveInfo {
  std::string name;  // "allreduce", "allgather", "reduce_scatter", "send", ...
  std::int64_t in_elements = 0, out_elements = 0;
  std::int64_t group_size = 0;  // 0: not recorded
  std::string dtype;            // "BFloat16", "Float", ...
  std::int64_t bytes() const;   // the larger of input and output, at the dtype's size (0 when unknown)
};

struct GpuActivity {
  enum class Kind : std::uint8_t { kernel, memcpy_h2d, memcpy_d2h, memcpy_d2d, memcpy_p2p, memcpy_other, memset };
  Kind kind = Kind::kernel;
  std::uint32_t name = 0;  // index into RankTrace::names
  std::int32_t device = 0, stream = 0;
  std::int64_t start_ns = 0, duration_ns = 0;
  std::int64_t bytes = 0;         // copies and memsets
  std::int32_t collective = -1;   // index into RankTrace::collectives, or -1
  std::int64_t external_id = -1;  // the CPU op that launched it (Kineto's "External id"); -1 when not recorded
};

// A CPU op whose kernels `calibrate --from-trace` can count FLOPs for (GEMMs and attention, is_shape_op),
// with the shapes the profiler recorded (record_shapes=True: "Input Dims", "Concrete Inputs").
struct ShapedOp {
  std::int64_t external_id = 0;
  std::string name;                                   // "aten::mm", "aten::_cudnn_attention_forward", ...
  std::vector<std::vector<std::int64_t>> input_dims;  // one list per input; empty for a non-tensor input
  std::vector<std::string> concrete_inputs;           // scalars as text ("True", "8192"); "" for tensors
  std::vector<std::string> input_types;               // "c10::BFloat16", "float", ...; empty when not recorded
};
// The ops whose shapes are kept (the rest cost memory for nothing).
bool is_shape_op(const std::string& name);

struct ProfilerStep {
  std::int64_t number = 0;  // N of "ProfilerStep#N"
  std::int64_t start_ns = 0, duration_ns = 0;
};

struct RankTrace {
  std::string origin;          // the file
  int rank = -1;               // distributedInfo.rank; -1 when the trace has none
  int world_size = 0;          // distributedInfo.world_size; 0 when the trace has none
  bool legacy_layout = false;  // PyTorch 1.x's categories
  std::vector<std::string> names;
  std::vector<GpuActivity> activities;  // in file order
  std::vector<ProfilerStep> steps;      // the host's ProfilerStep#N, ascending by start
  // The device's copies of them (gpu_user_annotation, newer PyTorch), ascending: one per step (Kineto writes one per
  // stream that ran the step's work; they are merged into the earliest start to the latest end).
  std::vector<ProfilerStep> gpu_steps;
  std::vector<CollectiveInfo> collectives;
  std::vector<ShapedOp> shaped_ops;  // where the trace recorded shapes, in file order
  std::string device_name;           // deviceProperties[0].name, e.g. "NVIDIA H200"; "" when not recorded
  std::int64_t events_read = 0;      // every element of traceEvents
};

// One trace file (gzip or plain: zlib tells them apart). InputError naming the file and, for a bad event, its index
// in traceEvents and the field; the byte offset for malformed JSON. Stops with trainyard::Interrupted on Ctrl-C.
RankTrace read_kineto_file(const std::string& path);
// A file, or every *.json / *.json.gz file of a directory (one per rank), ordered by rank (then name).
std::vector<RankTrace> read_kineto(const std::string& path);

// One rank's trace file read (read_kineto_file, read_nsys_file).
using RankReader = RankTrace (*)(const std::string& path);
// Every file's trace, ordered by rank (then name).
std::vector<RankTrace> read_ranks(const std::vector<std::string>& files, RankReader read);
// A job's traces one rank at a time: each call gives the next rank's trace, valid until the next call, or null when
// there is none left.
using RankSource = std::function<const RankTrace*()>;
// The traces of `ranks` (which must outlive the source), not copied.
RankSource each_rank(const std::vector<RankTrace>& ranks);
// The files read in turn, each trace freed before the next is read: memory holds one rank's trace.
RankSource read_each(std::vector<std::string> files, RankReader read);
// The files read_kineto reads: `path` itself, or a directory's *.json / *.json.gz by name (InputError for none).
std::vector<std::string> kineto_files(const std::string& path);
// `path` itself, or the files of a directory whose names `is_trace` takes, by name; InputError naming `expected`
// for none (kineto_files, nsys_files).
std::vector<std::string> trace_files(const std::string& path, const std::function<bool(const std::string&)>& is_trace, const std::string& expected);
// Whether `path` looks like a Kineto trace rather than trainyard's own timeline: a directory, a gzip file, or a file
// whose first 64 KiB hold "schemaVersion" or a "cat" key (trainyard's timelines have neither).
bool looks_like_kineto(const std::string& path);

}  // namespace trainyard::traces
