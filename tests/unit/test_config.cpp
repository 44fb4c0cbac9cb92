// FFN configs: ffnlab's JSON, Hugging Face config.json, validation.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ffnlab/error.hpp"
#include "ffnlab/io/hf_config.hpp"
#include "ffnlab/layers/ffn_config.hpp"

using namespace ffnlab;
using nlohmann::json;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, OwnJsonRoundTrips) {
  for (const auto& v : variant_names()) {
    FFNConfig c = variant_config(v, 24, 40, v != "glu");
    c.branches = 3;
    c.moe.num_shared = 1;
    const FFNConfig back = config_from_json(config_to_json(c));
    EXPECT_EQ(config_to_json(back), config_to_json(c)) << v;
    EXPECT_EQ(variant_name(back), v);
  }
  const FFNConfig s = config_from_json(
      json::parse(R"({"variant":"swiglu","d_model":64,"d_ff":172,"bias":false,"layout":"fused"})"));
  EXPECT_EQ(s.kind, FFNKind::glu);
  EXPECT_EQ(s.act.kind, Activation::silu);
  EXPECT_EQ(s.layout, GLULayout::fused);
}

TEST(Config, RejectsNonsenseWithOneLineNamingIt) {
  EXPECT_NE(error_of([] { config_from_json(json::parse(R"({"d_ff":0})")); }).find("d_ff = 0"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              config_from_json(json::parse(R"({"activation":"selu"})"));
            }).find("unknown activation 'selu'"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { config_from_json(json::parse(R"({"dff":10})")); }).find("unknown key 'dff'"),
      std::string::npos);
  EXPECT_NE(
      error_of([] { config_from_json(json::parse(R"({"d_model":"big"})")); }).find("[config]"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              config_from_json(json::parse(R"({"kind":"moe","moe":{"num_experts":8,"top_k":9}})"));
            }).find("top_k = 9 exceeds num_experts = 8"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              config_from_json(json::parse(R"({"kind":"multi_branch","layout":"fused"})"));
            }).find("layout 'fused'"),
            std::string::npos);
}

TEST(Config, HuggingFaceLlamaAndChatGLM) {
  const FFNConfig llama = hf_ffn_config(json::parse(
      R"({"model_type":"llama","hidden_size":4096,"intermediate_size":11008,"hidden_act":"silu"})"));
  EXPECT_EQ(llama.kind, FFNKind::glu);
  EXPECT_EQ(llama.act.kind, Activation::silu);
  EXPECT_EQ(llama.d_model, 4096);
  EXPECT_EQ(llama.d_ff, 11008);
  EXPECT_FALSE(llama.bias);
  EXPECT_EQ(llama.layout, GLULayout::separate);
  const FFNConfig gelu = hf_ffn_config(json::parse(
      R"({"model_type":"mistral","hidden_size":8,"intermediate_size":16,"hidden_act":"gelu_pytorch_tanh","mlp_bias":true})"));
  EXPECT_EQ(gelu.act.kind, Activation::gelu_tanh);
  EXPECT_TRUE(gelu.bias);
  const FFNConfig glm = hf_ffn_config(json::parse(
      R"({"model_type":"chatglm","hidden_size":4096,"ffn_hidden_size":13696,"add_bias_linear":false})"));
  EXPECT_EQ(glm.layout, GLULayout::fused);
  EXPECT_EQ(glm.d_ff, 13696);
  EXPECT_NE(error_of([] {
              hf_ffn_config(json::parse(R"({"model_type":"llama","hidden_size":8})"));
            }).find("lacks 'intermediate_size'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              hf_ffn_config(json::parse(R"({"model_type":"bert"})"));
            }).find("model_type 'bert'"),
            std::string::npos);
  EXPECT_NE(
      error_of([] {
        hf_ffn_config(json::parse(
            R"({"model_type":"llama","hidden_size":8,"intermediate_size":8,"hidden_act":"xielu"})"));
      }).find("unknown activation 'xielu'"),
      std::string::npos);
}
