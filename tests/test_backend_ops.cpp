// The op table (backend/ops.hpp): its entries expand to the right tensors, OpTensors finds them by name and refuses
// what an entry does not name, and the CUDA executor's accesses (which cannot run here) are held to the table by
// reading its source: every tensor it asks an op for is one the op's entry names, with the entry's dtype.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "backend/cpu_device.hpp"
#include "backend/device_ops.hpp"
#include "backend/model_state.hpp"
#include "backend/ops.hpp"
#include "common/error.hpp"
#include "tests/backend_fixtures.hpp"

namespace trainyard::backend {

namespace {

using sim::OpCode;

sim::Op attention_pair(OpCode code, int chunk, int kv_first, int kv_last) { return sim::Op::kv_range(code, 0, 1, chunk, kv_first, kv_last); }
// An LM-head piece's one-chunk ops as (sequence, chunk, first row, end row).
using Piece = std::tuple<int, int, int, int>;
std::vector<Piece> pieces_of(const sim::Op& piece, int row_begin, int row_end, std::int64_t chunk_tokens) {
  sim::Op o = piece;
  o.row_begin = row_begin;
  o.row_end = row_end;
  std::vector<Piece> out;
  for (const sim::Op& one : chunk_ops(o, chunk_tokens)) out.emplace_back(one.seq, one.chunk, one.row_begin, one.row_end);
  return out;
}

std::vector<Role> roles(const std::vector<Use>& uses) {
  std::vector<Role> out;
  for (const Use& u : uses) out.push_back(u.key.role);
  return out;
}

}  // namespace

TEST(OpTable, EveryComputeOpHasOneEntryAndMovesHaveNone) {
  for (int c = static_cast<int>(OpCode::embed); c <= static_cast<int>(OpCode::head_wgrad); ++c) {
    const auto code = static_cast<OpCode>(c);
    ASSERT_TRUE(is_compute_op(code)) << sim::to_string(code);
    EXPECT_EQ(op_spec(code).code, code);
    EXPECT_FALSE(op_spec(code).kernels.empty()) << sim::to_string(code);
  }
  for (OpCode code : {OpCode::none, OpCode::optimizer, OpCode::kv, OpCode::dkv, OpCode::acts, OpCode::states}) {
    EXPECT_FALSE(is_compute_op(code)) << sim::to_string(code);
    EXPECT_THROW(op_spec(code), InternalError);
  }
}

TEST(OpTable, AttentionExpandsItsKvRangeAndStartsOnlyOnTheDiagonal) {
  const auto m = test::tiny_model();
  const std::int64_t chunk = 16;
  const auto diagonal = compute_uses(attention_pair(OpCode::attn, 2, 2, 2), m, chunk);
  EXPECT_EQ(roles(diagonal), (std::vector<Role>{Role::q, Role::k, Role::v, Role::o_run, Role::lse, Role::o}));
  EXPECT_EQ(diagonal[3].access, Access::write);
  EXPECT_EQ(diagonal[3].dtype, ElementType::fp32);
  EXPECT_EQ(diagonal[3].elements, chunk * m.q_dim());
  EXPECT_EQ(diagonal[4].elements, chunk * m.heads);

  const auto earlier = compute_uses(attention_pair(OpCode::attn, 2, 0, 1), m, chunk);
  EXPECT_EQ(roles(earlier), (std::vector<Role>{Role::q, Role::k, Role::k, Role::v, Role::v, Role::o_run, Role::lse, Role::o}));
  EXPECT_EQ(earlier[1].key.chunk, 0);
  EXPECT_EQ(earlier[2].key.chunk, 1);
  EXPECT_EQ(earlier[5].access, Access::update);

  const auto backward = compute_uses(attention_pair(OpCode::attn_bwd, 2, 0, 1), m, chunk);
  int accumulators = 0;
  for (const Use& u : backward) {
    EXPECT_NE(u.key.role, Role::o) << "only the diagonal reads O (for D = rowsum(dO * O))";
    if (u.key.role == Role::dkv) {
      ++accumulators;
      EXPECT_EQ(u.access, Access::accumulate);
      EXPECT_EQ(u.elements, 2 * chunk * m.kv_dim());
    }
  }
  EXPECT_EQ(accumulators, 2);
}

TEST(OpTable, LayerOutputsGoToTheNextLayerAndHeadPiecesAreSizedByTheirRows) {
  const auto m = test::tiny_model();
  const auto residual = compute_uses(sim::Op{OpCode::residual2, 0, 1, 3}, m, 16);
  EXPECT_EQ(residual.back().key, (Key{Role::x, 0, 2, 3}));
  sim::Op piece{OpCode::head_dgrad, 0, static_cast<std::int32_t>(m.layers), 1};
  piece.row_begin = 4;
  piece.row_end = 12;
  const auto dgrad = compute_uses(piece, m, 16);
  ASSERT_EQ(dgrad.size(), 3u);
  EXPECT_EQ(dgrad[0].key.sub, 4);
  EXPECT_EQ(dgrad[0].elements, 8 * m.vocab);
  EXPECT_EQ(dgrad[2].access, Access::update) << "a later piece continues dx";
  piece.row_begin = 0;
  const auto first = compute_uses(piece, m, 16);
  EXPECT_EQ(first[2].access, Access::write);
  EXPECT_TRUE(first[2].zeroed) << "the first piece starts dx from zeros";
  EXPECT_EQ(first[2].elements, 16 * m.hidden);
}

// Zigzag over 8 chunks (cp 4): rank 1 holds chunks 1 and 6. Each op stands for its one-chunk ops; attention keeps
// only the pairs the causal mask leaves, each query chunk's diagonal first.
TEST(OpTable, ZigzagOpsStandForTheirOneChunkOps) {
  auto zigzag = [](sim::Op o) {
    o.zigzag = 8;
    return o;
  };
  auto pairs = [](const std::vector<sim::Op>& ops) {
    std::vector<std::pair<int, int>> out;
    for (const sim::Op& o : ops) {
      EXPECT_EQ(o.zigzag, 0);
      EXPECT_EQ(o.kv_first, o.kv_last);
      out.emplace_back(o.chunk, o.kv_first);
    }
    return out;
  };
  using Pairs = std::vector<std::pair<int, int>>;
  // The ring's first step, the rank's own block: both diagonals and chunk 6's queries on chunk 1.
  EXPECT_EQ(pairs(chunk_ops(zigzag(attention_pair(OpCode::attn, 1, 1, 1)), 4)), (Pairs{{1, 1}, {6, 6}, {6, 1}}));
  // Rank 0's block (chunks 0 and 7): both query chunks see chunk 0, neither sees chunk 7.
  EXPECT_EQ(pairs(chunk_ops(zigzag(attention_pair(OpCode::attn_bwd, 1, 0, 0)), 4)), (Pairs{{1, 0}, {6, 0}}));
  // Rank 3's block (chunks 3 and 4): only chunk 6's queries, on both.
  EXPECT_EQ(pairs(chunk_ops(zigzag(attention_pair(OpCode::attn, 1, 3, 3)), 4)), (Pairs{{6, 3}, {6, 4}}));
  // A K/V move or add: each chunk of the block, whatever the queries.
  EXPECT_EQ(pairs(chunk_ops(zigzag(attention_pair(OpCode::dkv_pass, 1, 3, 3)), 4)), (Pairs{{1, 3}, {1, 4}}));
  // Any other op: the chunk, then its mirror.
  const auto norm = chunk_ops(zigzag(sim::Op{OpCode::norm1, 0, 1, 1}), 4);
  ASSERT_EQ(norm.size(), 2u);
  EXPECT_EQ(norm[0].chunk, 1);
  EXPECT_EQ(norm[1].chunk, 6);
  // An LM-head piece over rows 2..6 of the rank's 8 rows: rows 2..4 of chunk 1 and 0..2 of chunk 6.
  EXPECT_EQ(pieces_of(zigzag(sim::Op{OpCode::head_xent, 0, 2, 1}), 2, 6, 4), (std::vector<Piece>{{0, 1, 2, 4}, {0, 6, 0, 2}}));
  // Its uses are its one-chunk ops' one after another; an op without zigzag is itself.
  const auto m = test::tiny_model();
  EXPECT_EQ(compute_uses(zigzag(sim::Op{OpCode::norm1, 0, 1, 1}), m, 4).size(), 2 * compute_uses(sim::Op{OpCode::norm1, 0, 1, 1}, m, 4).size());
  EXPECT_EQ(chunk_ops(sim::Op{OpCode::norm1, 0, 1, 1}, 4).size(), 1u);
}

// FPDT's run: an sp rank's ops cover its chunks one after another (rank 1 of 2, 3 chunks each: chunks 3..5), and
// an LM-head piece's rows span them end to end; an all-to-all's members hold their runs.
TEST(OpTable, ARunStandsForEachOfItsChunks) {
  const auto norm = chunk_ops(sim::Op::chunk_run(sim::Op{OpCode::norm2_bwd, 0, 1}, 3, 3), 4);
  ASSERT_EQ(norm.size(), 3u);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(std::tie(norm[k].chunk, norm[k].chunk_count), std::make_tuple(3 + k, std::uint8_t{1}));
  const sim::Op piece = sim::Op::chunk_run(sim::Op{OpCode::head_dgrad, 0, 2}, 3, 3);  // rows 3..9 of the rank's 12
  EXPECT_EQ(pieces_of(piece, 3, 9, 4), (std::vector<Piece>{{0, 3, 3, 4}, {0, 4, 0, 4}, {0, 5, 0, 1}}));
  EXPECT_EQ(pieces_of(piece, 8, 9, 4), (std::vector<Piece>{{0, 5, 0, 1}}));  // inside one chunk: itself, rebased
  sim::Op exchange = sim::Op::chunk_run(sim::Op{OpCode::heads_qkv, 0, 1}, -1, 3);
  EXPECT_EQ(member_chunks(exchange, 1), (std::vector<std::int32_t>{3, 4, 5}));
  const auto m = test::tiny_model();
  EXPECT_EQ(compute_uses(sim::Op::chunk_run(sim::Op{OpCode::norm1, 0, 1}, 3, 3), m, 4).size(),
            3 * compute_uses(sim::Op{OpCode::norm1, 0, 1, 3}, m, 4).size());
  // An attention op covers one query chunk (FPDT: one pair per block).
  EXPECT_THROW(chunk_ops(sim::Op::chunk_run(attention_pair(OpCode::attn, 1, 0, 0), 0, 2), 4), InternalError);
}

// A micro-batch of 2 sequences: each op stands for its ops on each sequence, and an LM-head piece's rows run over
// the sequences' rows end to end (a rank's chunk of 4 rows in each).
TEST(OpTable, AMicroBatchOpStandsForEachSequence) {
  const auto norm = chunk_ops(sim::Op::sequences(sim::Op{OpCode::norm1, 4, 1, 0}, 2), 4);
  ASSERT_EQ(norm.size(), 2u);
  EXPECT_EQ(std::tie(norm[0].seq, norm[1].seq), std::make_tuple(std::int16_t{4}, std::int16_t{5}));
  EXPECT_EQ(norm[1].seq_count, 1);
  EXPECT_EQ(pieces_of(sim::Op::sequences(sim::Op{OpCode::head_xent, 4, 2, 0}, 2), 2, 7, 4),  // rows 2..7 of the 8
            (std::vector<Piece>{{4, 0, 2, 4}, {5, 0, 0, 3}}));
  // Attention: each sequence's pairs; nothing across sequences.
  const auto pairs = chunk_ops(sim::Op::sequences(attention_pair(OpCode::attn, 0, 0, 0), 3), 4);
  ASSERT_EQ(pairs.size(), 3u);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(std::tie(pairs[s].seq, pairs[s].chunk, pairs[s].kv_first), std::make_tuple(std::int16_t(s), 0, 0));
  EXPECT_THROW(sim::Op::sequences(sim::Op{}, 256), InputError);
}

// Ulysses over 3 ranks: rank 2's attention works on head group 2 of all 3 chunks, every causal pair, each query
// chunk's diagonal first, its tensors a third as wide and keyed by the head group.
TEST(OpTable, UlyssesAttentionStandsForItsHeadGroupsPairs) {
  sim::Op op = attention_pair(OpCode::attn_bwd, 2, 0, 2);
  op.head_group = 2;
  op.head_groups = 3;
  std::vector<std::pair<int, int>> pairs;
  for (const sim::Op& o : chunk_ops(op, 4)) {
    EXPECT_EQ(o.head_group, 2);
    pairs.emplace_back(o.chunk, o.kv_first);
  }
  EXPECT_EQ(pairs, (std::vector<std::pair<int, int>>{{0, 0}, {1, 1}, {1, 0}, {2, 2}, {2, 0}, {2, 1}}));
  auto m = test::tiny_model();
  m.heads = 6;
  m.kv_heads = 3;
  sim::Op one = attention_pair(OpCode::attn, 1, 0, 0);
  one.head_group = 2;
  one.head_groups = 3;
  const auto uses = compute_uses(one, m, 4);
  ASSERT_FALSE(uses.empty());
  for (const Use& u : uses) EXPECT_EQ(u.key.heads, 3) << describe(u.key);
  EXPECT_EQ(uses.front().key.role, Role::q);
  EXPECT_EQ(uses.front().elements, 4 * 2 * m.head_dim) << "4 rows of 2 of the 6 heads";
}

TEST(OpTensors, FindsTensorsByNameAndRefusesWhatTheEntryDoesNotName) {
  const auto m = test::tiny_model();
  const sim::Op op = attention_pair(OpCode::attn, 1, 0, 1);
  const auto uses = compute_uses(op, m, 16);
  std::vector<int> slots;
  for (std::size_t i = 0; i < uses.size(); ++i) slots.push_back(100 + static_cast<int>(i));
  const OpTensors named(op, uses, slots);
  EXPECT_EQ(named.read(Role::q, ElementType::bf16), 100);
  EXPECT_EQ(named.read(Role::k, ElementType::bf16, 1), 102);
  EXPECT_EQ(named.read(Role::v, ElementType::bf16, 0), 103);
  EXPECT_EQ(named.write(Role::o_run, ElementType::fp32), 105);
  EXPECT_THROW(named.read(Role::d_o, ElementType::bf16), InternalError);    // not an attention forward's tensor
  EXPECT_THROW(named.read(Role::k, ElementType::bf16, 2), InternalError);   // outside the K/V range
  EXPECT_THROW(named.read(Role::o_run, ElementType::bf16), InternalError);  // fp32 in the table
  EXPECT_THROW(named.write(Role::q, ElementType::bf16), InternalError);     // read-only in the table
  const OpTensors by_key(op, uses);                                         // the CPU reference's form: tensors by key, no executor slots
  EXPECT_EQ(by_key.use(Role::k, 1).key.chunk, 1);
  EXPECT_THROW(by_key.read(Role::q, ElementType::bf16), InternalError);
  try {
    named.read(Role::dq, ElementType::fp32);
    FAIL() << "an unnamed tensor passed";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("attn"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dQ"), std::string::npos) << e.what();
  }
}

// The LinearSpec table says nothing the op table contradicts: each map's forward reads x at the input width and
// writes its blocks, and its dgrad and wgrad read dy as wide as the blocks together (on a model whose widths all
// differ: hidden 40, q 32, kv 16, ffn 48).
TEST(OpTable, TheLinearMapsAgreeWithTheirOpEntries) {
  const auto m = model::parse_custom_model("custom:layers=2,hidden=40,heads=4,kv_heads=2,head_dim=8,ffn_hidden=48,vocab=61");
  auto width_of = [&](OpCode code, Role role) -> std::int64_t {
    for (const TensorSpec& t : op_spec(code).tensors) {
      if (t.role == role) return width_elements(t.width, m);
    }
    return -1;
  };
  int maps = 0;
  for (int c = static_cast<int>(OpCode::embed); c <= static_cast<int>(OpCode::head_wgrad); ++c) {
    const auto code = static_cast<OpCode>(c);
    const LinearSpec* l = linear_spec(code);
    if (l == nullptr || code != l->forward) continue;
    ++maps;
    SCOPED_TRACE(std::string(sim::to_string(code)));
    std::int64_t blocks = 0, outputs = 0;
    for (Width w : l->out) blocks += width_elements(w, m);
    for (Role r : l->y) outputs += width_of(l->forward, r);
    const std::int64_t in = width_elements(l->in, m);
    EXPECT_EQ(width_of(l->forward, l->x), in);
    EXPECT_EQ(outputs, blocks);
    EXPECT_EQ(width_of(l->dgrad, l->dy), blocks);
    EXPECT_EQ(width_of(l->dgrad, l->dx), in);
    EXPECT_EQ(width_of(l->wgrad, l->dy), blocks);
    EXPECT_EQ(width_of(l->wgrad, l->x), in);
    EXPECT_EQ(linear_spec(l->dgrad), l);
    EXPECT_EQ(linear_spec(l->wgrad), l);
  }
  EXPECT_EQ(maps, 4);
}

// The CUDA executor's ops (device_ops.cpp), each run once on the CPU device in every form the table gives it (the
// starting and continuing attention pair and LM head piece): every tensor an op asks for passes OpTensors' check
// (its entry names it, with that dtype, writable where written), and every tensor of its entry is asked for.
namespace {

// A buffer on the device for each of `uses`, laid out one after another as the dataflow plan would.
struct OpBuffers {
  DataflowPlan flow;
  void* arena = nullptr;
  std::vector<int> slots;
  OpBuffers(Device& dev, const std::vector<Use>& uses) {
    std::int64_t at = 0;
    for (const Use& u : uses) {
      Instance i;
      i.key = u.key;
      i.dtype = u.dtype;
      i.bytes = u.elements * element_bytes(u.dtype);
      i.device_offset_bytes = at;
      at += i.bytes;
      slots.push_back(static_cast<int>(flow.instances.size()));
      flow.instances.push_back(i);
    }
    arena = dev.allocate(std::max<std::int64_t>(at, 1));
    dev.fill(arena, 0, std::max<std::int64_t>(at, 1));
  }
};

DeviceParameter device_parameter(Device& dev, std::int64_t n) {
  DeviceParameter p;
  p.n = n;
  p.weight = static_cast<bf16_bits*>(dev.allocate(n * 2));
  p.grad = static_cast<float*>(dev.allocate(n * 4));
  dev.fill(p.weight, 0, n * 2);
  dev.fill(p.grad, 0, n * 4);
  return p;
}

// Each compute op at layer 0 (the LM head's at the head), chunk 1 of 2, in each of its forms.
std::vector<sim::Op> every_op_form(const model::ModelConfig& m, std::int32_t chunk_tokens) {
  std::vector<sim::Op> forms;
  for (int c = static_cast<int>(OpCode::embed); c <= static_cast<int>(OpCode::head_wgrad); ++c) {
    const auto code = static_cast<OpCode>(c);
    sim::Op op{code, 0, 0, 1};
    if (op.is_lm_head()) {
      op.layer = static_cast<std::int32_t>(m.layers);
      for (auto [begin, end] : {std::pair{0, chunk_tokens / 2}, std::pair{chunk_tokens / 2, chunk_tokens}}) {
        op.row_begin = begin;
        op.row_end = end;
        forms.push_back(op);
      }
    } else if (code == OpCode::attn || code == OpCode::attn_bwd) {
      forms.push_back(attention_pair(code, 1, 0, 1));  // the diagonal's pair: starts the accumulators
      forms.push_back(attention_pair(code, 1, 0, 0));
    } else if (code == OpCode::dkv_add) {
      forms.push_back(attention_pair(code, 1, 0, 1));
    } else {
      forms.push_back(op);
    }
  }
  return forms;
}

}  // namespace

TEST(OpTable, TheExecutorsOpsTouchEveryTensorOfTheirEntry) {
  const auto m = test::tiny_model();
  const std::int32_t c = 8;
  const auto dev = make_cpu_device();
  const int stream = dev->create_stream();
  const std::int64_t h = m.hidden, f = m.ffn_hidden;
  const std::int64_t sizes[kLayerWeights] = {h, (m.q_dim() + 2 * m.kv_dim()) * h, h * m.q_dim(), h, 2 * f * h, h * f};
  std::vector<DeviceParameter> layer;
  for (std::int64_t n : sizes) layer.push_back(device_parameter(*dev, n));
  DeviceParameter embedding = device_parameter(*dev, m.vocab * h), final_norm = device_parameter(*dev, h),
                  lm_head = device_parameter(*dev, m.vocab * h);
  const std::vector<std::int32_t> tokens(2 * c + 1, 3);
  std::vector<float> losses(2 * c), dloss(c, 1.0f / (2 * c));

  int forms = 0;
  for (const sim::Op& op : every_op_form(m, c)) {
    const std::vector<Use> uses = compute_uses(op, m, c);
    OpBuffers buffers(*dev, uses);
    OpTensors tensors(op, uses, buffers.slots);
    std::vector<std::size_t> looked_up;
    tensors.record_lookups(&looked_up);
    DeviceOpArgs a;
    a.dev = dev.get();
    a.stream = stream;
    a.op = &op;
    a.tensors = &tensors;
    a.memory = {&buffers.flow, buffers.arena, nullptr};
    a.model = &m;
    a.chunk_tokens = c;
    for (int k = 0; k < kLayerWeights; ++k) a.layer[k] = &layer[k];
    a.embedding = &embedding;
    a.final_norm = &final_norm;
    a.lm_head = &lm_head;
    a.tokens = tokens.data() + op.chunk * c;
    a.losses = losses.data() + op.chunk * c;
    a.dloss = dloss.data();
    ASSERT_NO_THROW(run_device_op(a)) << sim::to_string(op.code) << ": an ask its entry does not allow";
    dev->synchronize();
    for (std::size_t i = 0; i < uses.size(); ++i) {
      EXPECT_TRUE(std::find(looked_up.begin(), looked_up.end(), i) != looked_up.end())
          << sim::to_string(op.code) << "'s " << describe(uses[i].key) << " is in the op table but the executor never touches it";
    }
    dev->release(buffers.arena);
    ++forms;
  }
  EXPECT_GE(forms, 34) << "every compute op, the attention pairs and head pieces in both forms";
  for (DeviceParameter* p : {&embedding, &final_norm, &lm_head}) layer.push_back(*p);
  for (DeviceParameter& p : layer) {
    dev->release(p.weight);
    dev->release(p.grad);
  }
}

}  // namespace trainyard::backend

namespace trainyard::backend {

// Tensor parallelism's shards (model_state.hpp): every element of a sharded parameter is in exactly one shard, a
// norm in every shard whole, and each shard is the size of the sharded model's parameter (ops.hpp tensor_shard).
TEST(TensorShards, EveryElementInOneShardAndTheShardsAreTheShardedModelsParameters) {
  model::ModelConfig m = test::tiny_model();
  m.vocab = 64;
  const int shards = 2;
  ModelState whole(m, 3), sharded(tensor_shard(m, shards), 3);
  const auto params = whole.all();
  const auto shard_params = sharded.all();
  std::vector<std::vector<int>> covered(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) covered[i].assign(params[i]->size(), 0);
  for (int s = 0; s < shards; ++s) {
    const auto layouts = tensor_shard_layouts(m, shards, s);
    ASSERT_EQ(layouts.size(), params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(layouts[i].elements(), static_cast<std::int64_t>(shard_params[i]->size())) << params[i]->name;
      std::vector<float> index(params[i]->size()), part(shard_params[i]->size());
      for (std::size_t k = 0; k < index.size(); ++k) index[k] = static_cast<float>(k);
      take_shard(layouts[i], index, part);
      for (float k : part) covered[i][static_cast<std::size_t>(k)] += 1;
      std::vector<float> back(index.size(), -1.0f);
      put_shard(layouts[i], part, back);
      for (float k : part) EXPECT_EQ(back[static_cast<std::size_t>(k)], k);
    }
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const bool norm = params[i]->name.find("norm") != std::string::npos;
    for (int c : covered[i]) ASSERT_EQ(c, norm ? shards : 1) << params[i]->name;
  }
  // Shard 1 of wqkv starts with Q's second half of rows (q_dim 32: rows 16..31 of hidden 32 columns).
  const auto wqkv = tensor_shard_layouts(m, shards, 1)[1];
  EXPECT_EQ(wqkv.row_blocks.front(), (std::pair<std::int64_t, std::int64_t>{16, 16}));
  model::ModelConfig odd = m;
  odd.vocab = 61;
  try {
    tensor_shard(odd, shards);
    FAIL() << "a vocabulary of 61 split in 2";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("vocab"), std::string::npos) << e.what();
  }
}

// HotSPa's switches move fractions of a unit between layouts of different TP degrees: the slices [0, 1/4) and
// [1/4, 1/2) hold exactly TP 2's shard 0 (the norms whole in each), and slices meeting at a cut share no element.
TEST(TensorShards, SlicesOfAFractionNestInsideTheShardsTheyCut) {
  model::ModelConfig m = test::tiny_model(true);
  m.vocab = 64;
  ModelState whole(m, 1);
  const auto params = whole.all();
  const auto shard0 = tensor_shard_layouts(m, 2, 0);
  const auto first = tensor_slice_layouts(m, 0, 0.25), second = tensor_slice_layouts(m, 0.25, 0.5);
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::vector<int> in_shard(params[i]->size(), 0), in_slices(params[i]->size(), 0);
    for_each_shard_element(shard0[i], [&](std::int64_t, std::int64_t e) { in_shard[static_cast<std::size_t>(e)] += 1; });
    for (const auto* slice : {&first[i], &second[i]}) {
      for_each_shard_element(*slice, [&](std::int64_t, std::int64_t e) { in_slices[static_cast<std::size_t>(e)] += 1; });
    }
    const bool norm = params[i]->name.find("norm") != std::string::npos;
    for (std::size_t e = 0; e < in_shard.size(); ++e) ASSERT_EQ(in_slices[e], norm ? 2 : in_shard[e]) << params[i]->name << " [" << e << "]";
  }
}

}  // namespace trainyard::backend
