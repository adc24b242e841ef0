// FPDT: Ulysses with attention in chunks whose K/V (and backward's q, o, dO, dq) stream from host DRAM.
#include "common/units.hpp"
#include "planner/engines/writers.hpp"
#include "planner/schemes/zero_family/family.hpp"
#include "planner/search.hpp"

namespace trainyard::planner {

namespace {

constexpr std::int64_t kSmallestFpdtChunk = 16 * 1024;  // the search's smallest FPDT chunk (DeepSpeed's default: 64K)

// What the executors run (LayerSplit::executable_fpdt): each sp rank's tokens a whole number of chunks, the heads
// split evenly over sp.
std::string fpdt_run_refusal(const StepInputs& in, const PlanSpec& spec, int ranks) {
  if (std::string needs = zero_family_run_refusal(in, spec, ranks); !needs.empty()) return needs;
  const ZeroParams& p = spec.as<ZeroParams>();
  const std::int64_t share = in.workload.seq_len / p.sp;
  if (p.fpdt_chunk >= in.workload.seq_len) return std::string();  // one chunk: Ulysses' attention, nothing streamed
  if (in.workload.seq_len / p.fpdt_chunk > 255) return "at most 255 FPDT chunks (" + std::to_string(in.workload.seq_len / p.fpdt_chunk) + ")";
  if (share % p.fpdt_chunk != 0) {
    return "an FPDT chunk dividing each sp rank's share of the sequence (" + format_tokens(share) + " tokens, chunk " + format_tokens(p.fpdt_chunk) +
           ")";
  }
  if (in.model.heads % p.sp != 0 || in.model.kv_heads % p.sp != 0) {
    return "an sp dividing the model's heads and K/V heads (" + std::to_string(in.model.heads) + ", " + std::to_string(in.model.kv_heads) + ")";
  }
  return std::string();
}

}  // namespace

Scheme fpdt_scheme() {
  Scheme s = zero_family_scheme("fpdt", "FPDT: Ulysses + sequence chunking + host offload, double-buffered", {"sp", "chunk"});
  s.summary = [](const PlanSpec& spec) {
    const ZeroParams& z = spec.as<ZeroParams>();
    return zero_family_summary(z, ", sp " + std::to_string(z.sp) + ", chunk " + format_tokens(z.fpdt_chunk));
  };
  s.from_flags = [](const FlagValues& flags, const sim::Cluster&) {
    PlanSpec spec = zero_family_from_flags(flags);
    spec.as<ZeroParams>().fpdt_chunk = parse_token_count(flags.text("chunk").value_or("64K"), "--chunk");  // FPDT's default chunk
    return spec;
  };
  s.run = RunFacet{.refusal = fpdt_run_refusal, .unchunked = nullptr};  // --check: the plain data-parallel step
  s.chunk = ChunkFacet{
      .tokens = [](const PlanSpec& spec) { return spec.as<ZeroParams>().fpdt_chunk; },
      .set_tokens = [](PlanSpec& spec, std::int64_t tokens) { spec.as<ZeroParams>().fpdt_chunk = tokens; },
      .interactive_chunks = 128,
  };
  s.enumerate = [](const StepInputs& in, const AddPlan& add) {
    const std::int64_t S = in.workload.seq_len;
    // FPDT's chunks are tens of K tokens (default 64K); a sequence too short for two of them is one chunk.
    std::vector<std::int64_t> chunks;
    for (std::int64_t chunk : chunk_sizes(S)) {
      if (chunk >= kSmallestFpdtChunk && chunk < S) chunks.push_back(chunk);
    }
    if (chunks.empty()) chunks.push_back(S);
    for (int sp : divisors(in.cluster.gpus())) {
      for (std::int64_t chunk : chunks) {
        ZeroParams base;
        base.sp = sp;
        base.fpdt_chunk = chunk;
        zero_family_variants("fpdt", base, true, add);  // FPDT runs with activation checkpointing
      }
    }
  };
  s.exports = {{"deepspeed", deepspeed_launch}};
  return s;
}

}  // namespace trainyard::planner
