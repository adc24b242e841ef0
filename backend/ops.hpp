#pragma once
// The op table: one entry per transformer op the executors run (sim::OpCode), naming the tensors it reads and
// writes, their shapes and dtypes, and the kernel that computes it. Everything in backend/ that needs to know
// what an op touches reads it here:
//   - the dataflow plan (dataflow.hpp) sizes, places and releases tensors from it,
//   - the CPU reference (reference_step.cpp) and the CUDA executor (executor.cpp) address their tensors through
//     OpTensors, which finds a tensor by name and refuses one the op's entry does not name (or names with another
//     dtype, or as read-only where the executor writes it).
// So reordering an entry's tensors cannot swap two buffers, and an executor that reads a tensor the table does not
// list fails at once, naming the op and the tensor. Plain C++, built and tested everywhere.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/reference.hpp"
#include "models/model.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::backend {

// The tensors of one (layer, chunk), by role. Forward: x (the layer's input), n1, q, k, v (after RoPE), o_run and
// lse (the running attention state), o, p (projection), h1, n2, gu (gate | up), a, mo (MLP output), then the next
// layer's x. Backward: dx is the gradient of x (OpCode::input_grad), dkv the fp32 dK | dV of a chunk, dkv_in
// the dK | dV accumulator another ring-attention rank sent (OpCode::dkv_pass), until dkv_add adds it to dkv.
// A table laid out by hand.
// clang-format off
enum class Role : std::uint8_t {
  x, n1, q, k, v, o_run, o, lse, p, h1, n2, gu, a, mo,
  dm, dh1, da, dgu, dn2, dp, d_o, delta, dq, dkv, dkv_in, dqkv, dn1, dx,
  nf, logits, dlogits,  // the LM head's pieces (sub = the piece's first token)
  // Under tensor parallelism (sim::Op::vocab_parallel), also per piece: dnf, the final norm output's gradient;
  // xstats, every vocabulary shard's cross-entropy statistics ([shard][2][rows]: log-sum-exp, then loss against
  // the shard's target logit), each shard writing its own block before their all-gather.
  dnf, xstats,
};
// clang-format on
std::string_view to_string(Role role);  // "Q", "dK|dV accumulator"

struct Key {
  Role role;
  std::int32_t seq, layer, chunk, sub = 0;
  std::int32_t heads = 0;  // 0: every head; g + 1: Ulysses' head group g only (sim::Op::head_group)
  auto operator<=>(const Key&) const = default;
};

std::string describe(const Key& k);  // "Q of layer 3 chunk 1 (sequence 0)"

// What one element of a tensor is stored as in the executors' memory. Not hw::Dtype, which names the math precision
// the simulator's peak tables are for (tf32 is a math mode, not a storage type).
enum class ElementType : std::uint8_t { bf16, fp32 };
constexpr std::int64_t element_bytes(ElementType t) { return t == ElementType::bf16 ? 2 : 4; }

// read: must exist. write: a new value (an existing buffer at that place is overwritten). update: read and then
// written in place. accumulate: added to in place, starting from zero where nothing has added yet.
enum class Access : std::uint8_t { read, write, update, accumulate };

// Which (layer, chunk) an op's tensor belongs to, relative to the op's own coordinates.
enum class Place : std::uint8_t {
  chunk,       // the op's (layer, chunk)
  kv_chunks,   // one tensor per K/V chunk op.kv_first..op.kv_last of the op's layer
  next_layer,  // (layer + 1, chunk): a layer's output is the next layer's input, its gradient comes from there
  head_piece,  // the op's chunk, rows [op.row_begin, op.row_end): the LM head's pieces (Key::sub = row_begin)
};

// A tensor's row width in elements. Rows are the chunk's tokens, or the piece's rows for Place::head_piece.
enum class Width : std::uint8_t {
  hidden,       // the model's hidden size
  q,            // heads x head_dim
  kv,           // kv_heads x head_dim
  qkv,          // dQ | dK | dV blocks one after another
  dkv,          // fp32 dK | dV blocks
  ffn,          // the MLP's inner width
  gate_up,      // gate | up (or dgate | dup): two [rows][ffn] halves
  vocab,        // logits (a vocabulary shard's under tensor parallelism)
  heads,        // one value per head and row (the attention lse and delta, [heads][rows])
  vocab_stats,  // 2 values per row and vocabulary shard (Role::xstats)
};

// Attention pairs and the LM head's pieces build a tensor over several tasks: the first (the diagonal pair, which
// runs first; the piece at row 0) starts it, the others continue it.
enum class When : std::uint8_t { always, starting, continuing };

struct TensorSpec {
  Role role;
  Access access;
  Width width;
  ElementType dtype = ElementType::bf16;
  Place place = Place::chunk;
  When when = When::always;
  bool zeroed = false;  // a new buffer is zeroed before the op (the LM head's pieces fill dx's rows one by one)
};

struct OpSpec {
  sim::OpCode code;
  std::string_view kernels;  // what computes it, as kernels/ names them: "rmsnorm", "gemm x3", "attention + merge"
  std::vector<TensorSpec> tensors;
};

// The table's entry for a compute op; InternalError for codes that are not compute ops (moves, the optimizer).
const OpSpec& op_spec(sim::OpCode code);
bool is_compute_op(sim::OpCode code);
// True for the task that starts what its siblings continue (see When).
bool starts_accumulation(const sim::Op& op);

// A layer's weights, in ModelState's per-layer order (LayerParameters: norm1, wqkv, wo, norm2, wup, wdown).
enum class LayerWeight : std::uint8_t { norm1, wqkv, wo, norm2, wup, wdown };
constexpr int kLayerWeights = 6;

// The layer's four linear maps y = x W^T (W [out][in]), read by both executors from here: the forward, the input
// gradient dx = dy W and the weight gradient dW += dy^T x. W's rows and y's columns come in blocks (qkv: Q, K, V;
// mlp_up: gate, up), which the CUDA executor runs as one GEMM each; `y` names one tensor per block, or one tensor
// holding every block.
struct LinearSpec {
  sim::OpCode forward, dgrad, wgrad;
  LayerWeight weight;
  Role x, dx;              // the forward's input and its gradient
  std::vector<Role> y;     // the forward's output(s)
  Role dy;                 // the output's gradient, every block in one tensor
  Width in;                // x's row width
  std::vector<Width> out;  // the blocks' widths
};
// The entry whose forward, dgrad or wgrad is `code`, or null.
const LinearSpec* linear_spec(sim::OpCode code);

struct Use {
  Key key;
  Access access = Access::read;
  std::int64_t elements = 0;  // the tensor's size in the executors' layout
  ElementType dtype = ElementType::bf16;
  bool zeroed = false;
};

// Ulysses' all-to-alls (sim::OpCode heads_qkv, heads_out, heads_dout, heads_dqkv; also Megatron's a2a context
// parallelism): each tensor they move, as
// [blocks][rows][row width] for every head (dK | dV: two blocks of K/V width); a head group's tensor holds the
// group's columns of every row, 1 / head_groups of it.
struct HeadsExchanged {
  Role role;
  int blocks;
  Width row;
  ElementType dtype;
};
bool is_heads_exchange(sim::OpCode code);
// Tensor parallelism's collectives (sim::OpCode::tp_sum_*, tp_gather_*): the tensor each works on in place (a
// zigzag op's: one per chunk_ops entry; tp_sum_norms: none, it sums parameters' gradients). The gathers
// (tp_gather_*) bring each member's block (its rows; the loss's statistics: its shard's) to every member.
bool is_tensor_parallel_collective(sim::OpCode code);
bool is_tensor_parallel_gather(sim::OpCode code);
std::vector<Key> tensor_parallel_keys(const sim::Op& op, std::int64_t chunk_tokens);
bool to_head_groups(sim::OpCode code);  // heads_qkv, heads_dout: from a chunk's heads to head groups
std::vector<HeadsExchanged> heads_exchanged(sim::OpCode code);
// The chunks an op covers, in the order its rows lie: `chunk`, and with zigzag its mirror; with a run
// (sim::Op::chunk_count) chunk .. chunk + chunk_count - 1.
std::vector<std::int32_t> covered_chunks(const sim::Op& op);
// The chunks member `member` of an all-to-all's group holds: its index, and with zigzag (Megatron's a2a context
// parallelism) that chunk's mirror too; with a run (FPDT), the member's run of chunk_count chunks.
std::vector<std::int32_t> member_chunks(const sim::Op& op, std::int32_t member);
std::int64_t width_elements(Width w, const model::ModelConfig& model);

// An attention op's shape for the kernels: its query chunk against its K/V chunks kv_first..kv_last laid end to
// end, causal with absolute offsets, in its head group (heads / head_groups).
kernels::AttentionShape attention_shape(const sim::Op& op, const model::ModelConfig& model, std::int64_t chunk_tokens);

// The model as an op's tensors see it: a Ulysses attention op's has heads / head_groups query heads and
// kv_heads / head_groups K/V heads; any other op's is `model`.
model::ModelConfig model_of(const sim::Op& op, const model::ModelConfig& model);
// One tensor-parallel shard of the model (sim::TaskGraph::tensor_shards): heads, K/V heads, the MLP's inner width
// and the vocabulary divided by `shards`, as one rank's tensors and weights see it. InputError (origin: the plan's
// model) when one of them does not divide.
model::ModelConfig tensor_shard(const model::ModelConfig& model, int shards);

// The one-chunk ops a zigzag op (sim::Op::zigzag) or a run (sim::Op::chunk_count > 1) stands for, in the order
// the executors run them; any other op alone. A zigzag op covers a chunk and its mirror (zigzag - 1 - chunk), a run
// its chunks one after another (covered_chunks), each of `chunk_tokens` rows (a run is never an attention op or a
// K/V move):
//  - attention (attn, attn_bwd): per query chunk, one op per K/V chunk (of the K/V chunks and their mirrors) not
//    wholly masked, its diagonal pair first (which starts the chunk's accumulators);
//  - the K/V chunk ops without a query chunk (dkv_add, and the moves kv, dkv, dkv_pass, kv_dkv): one per K/V chunk;
//  - the LM head's pieces: rows [row_begin, row_end) of the covered chunks laid end to end, split at the chunks' ends;
//  - every other op: once per chunk.
// Every entry has zigzag 0. Likewise a Ulysses attention op (sim::Op::head_groups > 0) stands for its pairs of
// query chunks 0..chunk and the K/V chunks not wholly masked, each query chunk's diagonal first, in its head group.
std::vector<sim::Op> chunk_ops(const sim::Op& op, std::int64_t chunk_tokens);

// The op's table entry applied to its coordinates: one Use per tensor it touches (an entry over K/V chunks gives
// one per chunk, in chunk order), sized for the model and the chunk (a Ulysses head group's: model_of); a zigzag
// or Ulysses attention op's are its chunk_ops' one after another. Throws InternalError for non-compute ops.
std::vector<Use> compute_uses(const sim::Op& op, const model::ModelConfig& model, std::int64_t chunk_tokens);

// A (layer, chunk) tensor of `role` as the op table has it (every entry naming a role gives it one width and dtype):
// its elements and dtype, for a tensor that arrives from another rank. InternalError for a role no entry names.
struct TensorShape {
  std::int64_t elements = 0;
  ElementType dtype = ElementType::bf16;
};
TensorShape chunk_tensor(Role role, const model::ModelConfig& model, std::int64_t chunk_tokens);

// One task's tensors, found by name. `slots[i]` is the executor's handle (an instance, a buffer) for `uses[i]`;
// without slots (the CPU reference, which addresses values by the uses' keys) only use() answers.
// A lookup names the tensor, the dtype the caller reads it as and whether it writes it; InternalError when the
// op's entry does not have that tensor, has it with another dtype, or has it read-only and the caller writes.
class OpTensors {
 public:
  OpTensors(const sim::Op& op, std::span<const Use> uses, std::span<const int> slots = {});
  int read(Role role, ElementType dtype, int kv_chunk = -1) const { return find(role, dtype, false, kv_chunk); }
  int write(Role role, ElementType dtype, int kv_chunk = -1) const { return find(role, dtype, true, kv_chunk); }
  // The tensor itself (for the CPU reference, which addresses its values by Key).
  const Use& use(Role role, int kv_chunk = -1, bool writes = false) const;
  // Every lookup that passes appends the index of its use here (a test's view of what an executor touched).
  void record_lookups(std::vector<std::size_t>* into) { looked_up_ = into; }

 private:
  int find(Role role, ElementType dtype, bool writes, int kv_chunk) const;
  std::size_t index(Role role, int kv_chunk) const;
  const sim::Op& op_;
  std::span<const Use> uses_;
  std::span<const int> slots_;
  std::vector<std::size_t>* looked_up_ = nullptr;
};

}  // namespace trainyard::backend
