// FFN configs: ffnlab's JSON, Hugging Face config.json, validation.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/io/hf_config.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

using namespace ffnlab;
using nlohmann::json;

namespace {
using test::error_of;
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
  // A key the layer would not read is refused, not ignored.
  EXPECT_NE(error_of([] {
              config_from_json(json::parse(R"({"variant":"relu","moe":{"num_experts":4}})"));
            }).find("key 'moe' applies to an MoE layer (variant moe), not to this relu layer"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              config_from_json(json::parse(R"({"variant":"swiglu","branches":4})"));
            }).find("key 'branches' applies to the gated FFN (variant gated), not to this swiglu"),
            std::string::npos);
  EXPECT_NO_THROW(config_from_json(json::parse(R"({"variant":"gated","branches":4})")));
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

TEST(Config, MoEOptionsRoundTrip) {
  FFNConfig c = variant_config("moe", 24, 40, false);
  auto& m = c.moe;
  m.num_experts = 12;
  m.top_k = 3;
  m.expert_kind = FFNKind::glu;
  m.score = ScoreFunc::sigmoid;
  m.groups = 4;
  m.topk_groups = 2;
  m.scaling = 2.5f;
  m.balance_bias = true;
  m.capacity_factor = 1.25;
  m.drop = DropPolicy::probability;
  m.balance_loss = BalanceLoss::top1;
  m.aux_coef = 0.01f;
  m.z_coef = 0.001f;
  m.naming = MoENaming::qwen2_moe;
  m.num_shared = 1;
  const json j = config_to_json(c);
  EXPECT_EQ(config_to_json(config_from_json(j)), j);
  EXPECT_EQ(j["moe"]["score"], "sigmoid");
  EXPECT_EQ(j["moe"]["drop"], "probability");
  EXPECT_NE(error_of([] {
              config_from_json(json::parse(R"({"kind":"moe","moe":{"score":"relu"}})"));
            }).find("unknown scoring function 'relu' (known: softmax, sigmoid)"),
            std::string::npos);
  // The routing keys: printed only when they say something (a top-k config prints none).
  EXPECT_FALSE(j["moe"].contains("routing"));
  EXPECT_FALSE(j["moe"].contains("top_p"));
  EXPECT_FALSE(j["moe"].contains("entropy_coef"));
  EXPECT_FALSE(j["moe"].contains("target_sparsity"));
  EXPECT_FALSE(j["moe"].contains("l1_coef_init"));
  FFNConfig p = variant_config("moe", 24, 40, false);
  p.moe.routing = RoutingKind::top_p;
  p.moe.top_p = 0.6f;
  p.moe.entropy_coef = 1e-4f;
  const json jp = config_to_json(p);
  EXPECT_EQ(jp["moe"]["routing"], "top_p");
  EXPECT_FLOAT_EQ(jp["moe"]["top_p"].get<float>(), 0.6f);
  EXPECT_EQ(config_to_json(config_from_json(jp)), jp);
  EXPECT_NE(error_of([] {
              config_from_json(json::parse(R"({"kind":"moe","moe":{"routing":"top_q"}})"));
            }).find("unknown routing 'top_q' (known: " + join_names(routing_names()) + ")"),
            std::string::npos);
  FFNConfig r = variant_config("moe", 24, 40, false);
  r.moe.routing = RoutingKind::relu;
  r.moe.normalize = false;
  r.moe.target_sparsity = 0.8f;
  r.moe.l1_coef_init = 1e-4f;
  const json jr = config_to_json(r);
  EXPECT_EQ(jr["moe"]["routing"], "relu");
  EXPECT_FALSE(jr["moe"].contains("top_p"));
  EXPECT_FLOAT_EQ(jr["moe"]["target_sparsity"].get<float>(), 0.8f);
  EXPECT_FLOAT_EQ(jr["moe"]["l1_coef_init"].get<float>(), 1e-4f);
  EXPECT_FLOAT_EQ(jr["moe"]["l1_coef_rate"].get<float>(), 1.2f);
  EXPECT_EQ(config_to_json(config_from_json(jr)), jr);
}

TEST(Config, HuggingFaceMoE) {
  const FFNConfig mix = hf_ffn_config(json::parse(
      R"({"model_type":"mixtral","hidden_size":4096,"intermediate_size":14336,
          "num_local_experts":8,"num_experts_per_tok":2,"router_aux_loss_coef":0.02})"));
  EXPECT_EQ(mix.kind, FFNKind::moe);
  EXPECT_EQ(mix.moe.naming, MoENaming::mixtral);
  EXPECT_TRUE(mix.moe.normalize);
  EXPECT_FALSE(mix.moe.router_bias);
  EXPECT_FLOAT_EQ(mix.moe.aux_coef, 0.02f);
  EXPECT_EQ(mix.expert_d_ff(), 14336);

  const FFNConfig qwen = hf_ffn_config(json::parse(
      R"({"model_type":"qwen2_moe","hidden_size":2048,"moe_intermediate_size":1408,
          "shared_expert_intermediate_size":5632,"num_experts":60,"num_experts_per_tok":4})"));
  EXPECT_EQ(qwen.moe.num_shared, 1);
  EXPECT_EQ(qwen.shared_d_ff(), 5632);
  EXPECT_TRUE(qwen.moe.shared_gate);
  EXPECT_FALSE(qwen.moe.normalize);  // norm_topk_prob defaults to false

  json ds = json::parse(
      R"({"model_type":"deepseek_v3","hidden_size":7168,"moe_intermediate_size":2048,
          "n_routed_experts":256,"num_experts_per_tok":8,"n_shared_experts":1,"n_group":8,
          "topk_group":4,"routed_scaling_factor":2.5,"norm_topk_prob":true,
          "scoring_func":"sigmoid","topk_method":"noaux_tc"})");
  const FFNConfig v3 = hf_ffn_config(ds);
  EXPECT_EQ(v3.moe.score, ScoreFunc::sigmoid);
  EXPECT_EQ(v3.moe.groups, 8);
  EXPECT_EQ(v3.moe.topk_groups, 4);
  EXPECT_TRUE(v3.moe.balance_bias);
  EXPECT_FLOAT_EQ(v3.moe.scaling, 2.5f);
  ds["topk_method"] = "greedy";
  EXPECT_EQ(hf_ffn_config(ds).moe.groups, 0);
  ds["topk_method"] = "group_limited_greedy";
  EXPECT_NE(error_of([&] { hf_ffn_config(ds); }).find("topk_method 'group_limited_greedy'"),
            std::string::npos);
  ds["topk_method"] = "noaux_tc";
  ds["topk_group"] = 9;
  EXPECT_NE(error_of([&] { hf_ffn_config(ds); }).find("topk_group = 9"), std::string::npos);
}

// A config file's routing brings its defaults for the MoE keys it leaves out: top-p weights each
// chosen expert by its probability, as the paper (no renormalisation), and so do ReLU routing
// and expert choice; a key the file gives is kept. Top-k renormalises.
TEST(Config, ARoutingBringsItsDefaultsToTheKeysAFileLeavesOut) {
  const auto moe_of = [](const char* text) { return config_from_json(json::parse(text)).moe; };
  EXPECT_TRUE(moe_of(R"({"variant":"moe","moe":{}})").normalize);
  EXPECT_FALSE(moe_of(R"({"variant":"moe","moe":{"routing":"top_p"}})").normalize);
  EXPECT_TRUE(moe_of(R"({"variant":"moe","moe":{"routing":"top_p","normalize":true}})").normalize);
  EXPECT_FALSE(moe_of(R"({"variant":"moe","moe":{"routing":"relu"}})").normalize);
  EXPECT_FALSE(moe_of(R"({"variant":"moe","moe":{"routing":"expert_choice"}})").normalize);
  // A given value the routing cannot take is still refused, naming the key.
  EXPECT_NE(error_of([&] {
              moe_of(R"({"variant":"moe","moe":{"routing":"relu","normalize":true}})");
            }).find("normalize: true"),
            std::string::npos);
  // The printed config says normalize either way, so a checkpoint reads back as it was trained.
  FFNConfig c = variant_config("moe", 24, 40, false);
  c.moe.routing = RoutingKind::top_p;
  c.moe.normalize = true;
  EXPECT_EQ(config_to_json(c)["moe"]["normalize"], true);
  EXPECT_TRUE(config_from_json(config_to_json(c)).moe.normalize);
}

// A gate on shared experts that the layer does not have is refused (it failed later, naming a
// missing parameter).
TEST(Config, SharedGateNeedsSharedExperts) {
  EXPECT_NE(error_of([] {
              config_from_json(json::parse(R"({"variant":"moe","moe":{"shared_gate":true}})"));
            }).find("[moe] shared_gate gates the shared experts' output: it needs num_shared > 0"),
            std::string::npos);
  EXPECT_NO_THROW(config_from_json(
      json::parse(R"({"variant":"moe","moe":{"shared_gate":true,"num_shared":1}})")));
}
