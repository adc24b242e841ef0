#include <algorithm>
#include <functional>

#include <gtest/gtest.h>

#include "common/error.hpp"
#include "models/catalog.hpp"
#include "test_support.hpp"

namespace trainyard::model {

TEST(Models, AllBuiltinsLoad) {
  const std::vector<std::string> expected = {"gpt-13b",    "gpt-2.7b",  "gpt-30b",     "gpt-6.7b",   "hotspa-32b", "llama-32b",   "llama2-13b",
                                             "llama2-70b", "llama2-7b", "llama3-405b", "llama3-70b", "llama3-8b",  "llama3.2-1b", "llama3.2-3b"};
  EXPECT_EQ(builtin_model_names(), expected);
  for (const auto& name : expected) {
    SCOPED_TRACE(name);
    const ModelConfig m = load_model(name);
    EXPECT_EQ(m.name, name);
    EXPECT_GT(m.params(), 1e9);
  }
}

// Published parameter counts, within 0.5%.
TEST(Models, ParameterCountsMatchPublishedFigures) {
  const std::pair<const char*, double> published[] = {{"llama3-8b", 8.03e9},    {"llama2-7b", 6.74e9},  {"llama3-70b", 70.6e9},
                                                      {"llama3-405b", 405.9e9}, {"llama2-13b", 13.0e9}, {"llama2-70b", 69.0e9},
                                                      {"llama3.2-1b", 1.24e9},  {"llama3.2-3b", 3.21e9}};
  for (const auto& [name, params] : published) {
    SCOPED_TRACE(name);
    EXPECT_NEAR(load_model(name).params() / params, 1.0, 0.005);
  }
}

TEST(Models, HandComputedLlama3_8b) {
  const ModelConfig m = load_model("llama3-8b");
  const ParamCounts p = m.param_counts();
  EXPECT_DOUBLE_EQ(p.embedding, 128256.0 * 4096);
  EXPECT_DOUBLE_EQ(p.lm_head, 128256.0 * 4096);
  // q and o 4096x4096, k and v 4096x1024, MLP 3 x 4096x14336, two RMSNorm scales.
  EXPECT_DOUBLE_EQ(p.attention_per_layer, 2 * 4096.0 * 4096 + 2 * 4096.0 * 1024);
  EXPECT_DOUBLE_EQ(p.mlp_per_layer, 3 * 4096.0 * 14336);
  EXPECT_DOUBLE_EQ(p.norms_per_layer, 2 * 4096.0);
  EXPECT_DOUBLE_EQ(m.params(), 8030261248.0);
  // Dense forward FLOPs per token: 2 x (matrix weights of all layers + LM head).
  const double matrices = 32 * (2 * 4096.0 * 4096 + 2 * 4096.0 * 1024 + 3 * 4096.0 * 14336) + 128256.0 * 4096;
  EXPECT_DOUBLE_EQ(m.dense_flops_per_token_fwd(), 2 * matrices);
  // Attention: 4 * kv_len * q_dim * L, kv_len averaged (S+1)/2 for causal.
  EXPECT_DOUBLE_EQ(m.attention_flops_per_token_fwd(8192, false), 4.0 * 8192 * 4096 * 32);
  EXPECT_DOUBLE_EQ(m.attention_flops_per_token_fwd(8192, true), 4.0 * 4096.5 * 4096 * 32);
  EXPECT_DOUBLE_EQ(m.training_flops_per_token(8192, true), 3 * (m.dense_flops_per_token_fwd() + m.attention_flops_per_token_fwd(8192, true)));
}

// HotSPa's artifact's 32B (llama_hot_switch.sh): head dim 6656 / 64 = 104, no biases, untied head, SwiGLU.
TEST(Models, HotSpaArtifact32b) {
  const ModelConfig m = load_model("hotspa-32b");
  EXPECT_EQ(m.head_dim, 104);
  const double h = 6656, f = 17920, v = 30592;
  EXPECT_DOUBLE_EQ(m.params(), 60 * (4 * h * h + 3 * h * f + 2 * h) + 2 * v * h + h);
}

TEST(Models, TiedEmbeddingsHaveNoSeparateHead) {
  const ModelConfig m = load_model("llama3.2-1b");
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_EQ(m.param_counts().lm_head, 0);
  // The LM head matmul still costs FLOPs when its weights are tied.
  EXPECT_GT(m.dense_flops_per_token_fwd(), 2 * (m.params() - m.param_counts().embedding));
}

TEST(Models, GptBiasesAndLayerNorm) {
  const ModelConfig m = load_model("gpt-6.7b");
  const ParamCounts p = m.param_counts();
  EXPECT_DOUBLE_EQ(p.attention_per_layer, 4 * 4096.0 * 4096 + 4 * 4096);
  EXPECT_DOUBLE_EQ(p.mlp_per_layer, 2 * 4096.0 * 16384 + 16384 + 4096);
  EXPECT_DOUBLE_EQ(p.norms_per_layer, 4 * 4096.0);
}

TEST(Models, MegatronFormulaAgreesForAGptShape) {
  // For MHA with a 4h GELU MLP and no biases the two conventions agree up to biases, norms and the causal
  // halving: compare non-causal training FLOPs.
  const ModelConfig m = parse_custom_model("custom:layers=24,hidden=2048,heads=16,activation=gelu,vocab=51200");
  const double ours = 3 * (m.dense_flops_per_token_fwd() + m.attention_flops_per_token_fwd(4096, false));
  EXPECT_NEAR(ours / m.megatron_flops_per_token(4096), 1.0, 1e-9);
}

TEST(Models, MegatronDeepSpeedFormulasAsItsLogCountsThem) {
  // Llama 3 8B at 4M tokens with activation checkpointing, by hand from megatron/utils.py throughput_calculator.
  const ModelConfig m = load_model("llama3-8b");
  const double h = 4096, l = 32, s = 4194304, v = 128256, ffn = 14336;
  FlopConvention c{false, true, false, FlopFormula::megatron_deepspeed_2023};
  EXPECT_DOUBLE_EQ(convention_flops_per_token(m, 4194304, c, true), 24 * 4 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)));
  EXPECT_DOUBLE_EQ(convention_flops_per_token(m, 4194304, c, false), 24 * 3 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)));
  c.formula = FlopFormula::megatron_deepspeed_2024;
  // g = 32 / 8 = 4: 2 // 4 = 0, so the K/V projections drop out as its integer division drops them.
  const double macs = l * 2 * h * h + 2 * l * h * s + l * 3 * ffn * h + v * h;
  EXPECT_DOUBLE_EQ(convention_flops_per_token(m, 4194304, c, true), 2 * 4 * macs);
}

TEST(Models, AFormulaNeedsTheSwitchesItCountsBy) {
  const auto parse = [](const std::string& text) {
    const json::Json doc = json::Json::parse(text);
    return parse_flop_convention(json::Reader(doc, "c.json"));
  };
  EXPECT_EQ(parse(R"({"causal_attention_halved": false, "recompute_counted": true, "input_embedding_counted": false,
                       "formula": "megatron-deepspeed-2024"})")
                .formula,
            FlopFormula::megatron_deepspeed_2024);
  const std::string error = test::error_of([&] {
    parse(R"({"causal_attention_halved": true, "recompute_counted": true, "input_embedding_counted": false, "formula": "megatron-deepspeed-2023"})");
  });
  EXPECT_NE(error.find("formula"), std::string::npos) << error;
  EXPECT_NE(error.find("c.json"), std::string::npos) << error;
}

TEST(Models, ModelStateBytes) {
  const ModelConfig m = load_model("llama3-8b");
  const auto bytes = model_state_bytes(m, precision_policy("bf16-mixed"));
  EXPECT_DOUBLE_EQ(bytes.weights, 2 * m.params());
  EXPECT_DOUBLE_EQ(bytes.total(), 16 * m.params());
  EXPECT_DOUBLE_EQ(model_state_bytes(m, precision_policy("bf16-mixed-fp32-grads")).total(), 18 * m.params());
  EXPECT_THROW(precision_policy("int4"), InputError);
}

TEST(Models, CustomModelFillsAndReportsDefaults) {
  std::vector<std::string> defaults;
  const ModelConfig m = load_model("custom:layers=24,hidden=2304,heads=24", "--model", &defaults);
  EXPECT_EQ(m.layers, 24);
  EXPECT_EQ(m.kv_heads, 24);
  EXPECT_EQ(m.head_dim, 96);
  EXPECT_EQ(m.ffn_hidden, 6144);  // 8/3 * 2304 = 6144, already a multiple of 256
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_NE(std::find(defaults.begin(), defaults.end(), "kv_heads=24"), defaults.end());
  EXPECT_NE(std::find(defaults.begin(), defaults.end(), "vocab=32000"), defaults.end());
  const ModelConfig g = load_model("custom:layers=2,hidden=512,heads=8,activation=gelu,kv_heads=2");
  EXPECT_EQ(g.ffn_hidden, 2048);
  EXPECT_EQ(g.kv_heads, 2);
}

TEST(Models, BadCustomModelsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"custom:layers=24,hidden=2304", "custom.heads"},
      {"custom:layers=24,hidden=2304,heads=24,hiddn=3", "custom.hiddn"},
      {"custom:layers=0,hidden=2304,heads=24", "custom.layers"},
      {"custom:layers=24,hidden=2304,heads=24,kv_heads=5", "custom.kv_heads"},
      {"custom:layers=24,hidden=2304,heads=7", "custom.heads"},
      {"custom:layers=24,hidden=2304,heads=24,activation=relu", "custom.activation"},
      {"custom:layers24", "custom"},
  };
  for (const auto& [spec, field] : cases) {
    SCOPED_TRACE(spec);
    try {
      load_model(spec);
      FAIL() << "accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--model"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("'") + field), std::string::npos) << e.what();
    }
  }
}

// What the executors need beyond the shape comes from the model's own config, once.
TEST(Models, ExecutorConstantsComeFromTheModelFile) {
  const ModelConfig llama3 = load_model("llama3-8b");
  EXPECT_DOUBLE_EQ(llama3.norm_epsilon, 1e-5);
  ASSERT_TRUE(llama3.rope_theta.has_value());
  EXPECT_DOUBLE_EQ(*llama3.rope_theta, 500000);
  EXPECT_FALSE(llama3.norm_weight_decay);
  EXPECT_DOUBLE_EQ(load_model("llama2-7b").rope_theta.value_or(0), 10000);
  const ModelConfig custom = parse_custom_model("custom:layers=2,hidden=64,heads=4,norm_epsilon=1e-6,rope_theta=1000000");
  EXPECT_DOUBLE_EQ(custom.norm_epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(custom.rope_theta.value_or(0), 1e6);
  EXPECT_DOUBLE_EQ(parse_custom_model("custom:layers=2,hidden=64,heads=4").rope_theta.value_or(0), 10000);
}

TEST(Models, BadModelFiles) {
  test::TempDir dir;
  const std::pair<std::function<void(nlohmann::json&)>, std::string> cases[] = {
      {[](auto& j) { j["hidden"] = -4096; }, "field 'hidden': expected an integer in [8,"},
      {[](auto& j) { j.erase("vocab"); }, "field 'vocab'"},
      {[](auto& j) { j["n_layers"] = 32; }, "field 'n_layers'"},
      {[](auto& j) { j["norm"] = "batchnorm"; }, "rmsnorm, layernorm"},
      {[](auto& j) { j["tied_embeddings"] = "no"; }, "true or false"},
      {[](auto& j) { j.erase("norm_epsilon"); }, "field 'norm_epsilon'"},
      {[](auto& j) { j["norm_epsilon"] = 0; }, "field 'norm_epsilon'"},
      {[](auto& j) { j["rope_theta"] = "500k"; }, "field 'rope_theta'"},
      {[](auto& j) { j.erase("norm_weight_decay"); }, "field 'norm_weight_decay'"},
  };
  for (const auto& [mutate, expected] : cases) {
    nlohmann::json doc = test::source_json("models/llama3-8b.json");
    mutate(doc);
    const std::string path = dir.write("m.json", doc.dump());
    try {
      load_model(path);
      FAIL() << "accepted: " << expected;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

}  // namespace trainyard::model
