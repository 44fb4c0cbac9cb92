// Closed-form costs: the tutorial's parameter counts, the count of instantiated layers, FLOPs.
#include <gtest/gtest.h>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/layers/feed_forward.hpp"

using namespace ffnlab;

TEST(Costs, SeedParameterCountsAreExact) {
  // d_model 512, d_ff 2048, every Linear with bias; 4 branches; 8 experts with a biased router.
  EXPECT_EQ(count_params(variant_config("relu", 512, 2048, true)), 2'099'712);
  EXPECT_EQ(count_params(variant_config("gelu", 512, 2048, true)), 2'099'712);
  EXPECT_EQ(count_params(variant_config("glu", 512, 2048, true)), 3'150'336);
  FFNConfig gated = variant_config("gated", 512, 2048, true);
  gated.branches = 4;
  EXPECT_EQ(count_params(gated), 9'454'080);
  FFNConfig moe = variant_config("moe", 512, 2048, true);
  moe.moe.num_experts = 8;
  EXPECT_EQ(count_params(moe), 16'801'800);
}

TEST(Costs, ClosedFormEqualsInstantiatedLayers) {
  int checked = 0;
  for (const auto& v : {"relu", "gelu", "glu", "bilinear", "reglu", "geglu", "swiglu", "gated"})
    for (bool bias : {true, false})
      for (std::int64_t D : {1, 7, 64})
        for (std::int64_t F : {1, 13, 96})
          for (int branches : {1, 2, 5})
            for (GLULayout layout : {GLULayout::separate, GLULayout::fused}) {
              FFNConfig c = variant_config(v, D, F, bias);
              c.branches = branches;
              c.layout = layout;
              if (c.kind == FFNKind::multi_branch && layout == GLULayout::fused) continue;
              if (c.kind != FFNKind::multi_branch && branches != 1) continue;
              EXPECT_EQ(count_params(c), make_ffn(c, 0)->parameters().count())
                  << variant_name(c) << " D=" << D << " F=" << F << " bias=" << bias;
              ++checked;
            }
  EXPECT_GT(checked, 150);
}

TEST(Costs, MoEClosedFormEqualsInstantiatedLayers) {
  int checked = 0;
  for (const char* expert : {"relu", "swiglu"})
    for (bool bias : {true, false})
      for (bool router_bias : {true, false})
        for (int shared : {0, 1, 3})
          for (bool gate : {false, true})
            for (bool noisy : {false, true}) {
              const FFNConfig e = variant_config(expert, 7, 5, bias);
              FFNConfig c = variant_config("moe", 7, 5, bias);
              c.act = e.act;
              c.moe.expert_kind = e.kind;
              c.moe.num_experts = 5;
              c.moe.top_k = 2;
              c.moe.router_bias = router_bias;
              c.moe.num_shared = shared;
              c.moe.shared_d_ff = shared > 0 ? 3 : 0;
              c.moe.shared_gate = gate && shared > 0;
              c.moe.noisy_topk = noisy;
              c.moe.balance_bias = noisy;  // state, not a trained parameter: not counted
              const auto ffn = make_ffn(c, 0);
              const auto& params = ffn->parameters();
              std::int64_t trained = 0;
              for (const auto& p : params.list())
                if (p.trainable) trained += shape_numel(p.shape);
              EXPECT_EQ(count_params(c), trained)
                  << expert << " bias=" << bias << " shared=" << shared << " gate=" << gate;
              ++checked;
            }
  EXPECT_EQ(checked, 96);
}

// MoE++: the constant experts' vectors and gates, and the gating residual's map [E', E'] over the
// router's E' = 8 columns, with its products (2·E'² forward, 4·E'² backward per token).
TEST(Costs, MoEPlusPlusClosedFormEqualsInstantiatedLayers) {
  FFNConfig c = variant_config("moe", 7, 5, true);
  c.moe.num_experts = 4;
  c.moe.constant_experts = 2;
  c.moe.copy_experts = c.moe.zero_experts = 1;
  const FFNCost without = ffn_cost(c, 8);
  for (bool residual : {false, true}) {
    c.moe.gating_residual = residual;
    const auto ffn = make_ffn(c, 0);
    std::int64_t trained = 0;
    for (const auto& p : ffn->parameters().list())
      if (p.trainable) trained += shape_numel(p.shape);
    EXPECT_EQ(count_params(c), trained) << residual;
  }
  const FFNCost with = ffn_cost(c, 8);
  EXPECT_EQ(with.params - without.params, 64);
  EXPECT_DOUBLE_EQ(with.forward.matmul - without.forward.matmul, 2.0 * 64);
  EXPECT_DOUBLE_EQ(with.backward.matmul - without.backward.matmul, 4.0 * 64);
}

TEST(Costs, MoEActiveParametersAndFlops) {
  FFNConfig c = variant_config("moe", 512, 2048, true);
  c.moe.num_experts = 8;
  c.moe.top_k = 2;
  const FFNCost moe = ffn_cost(c, 8);
  const FFNCost dense = ffn_cost(variant_config("relu", 512, 2048, true), 8);
  EXPECT_EQ(moe.active_params, 4'104 + 2 * 2'099'712);
  // Top-2: each token runs two full experts, so forward products are 2x one dense FFN + router.
  EXPECT_DOUBLE_EQ(moe.forward.matmul, 2 * dense.forward.matmul + 2.0 * 512 * 8);
  // Shared experts add to both counts.
  c.moe.num_shared = 1;
  c.moe.shared_gate = true;
  EXPECT_EQ(count_params(c), 16'801'800 + 2'099'712 + 512);
}

TEST(Costs, DenseFlopsAndMemory) {
  const FFNCost relu = ffn_cost(variant_config("relu", 512, 2048, true), 8);
  EXPECT_DOUBLE_EQ(relu.forward.matmul, 4.0 * 512 * 2048);
  EXPECT_DOUBLE_EQ(relu.backward.matmul, 8.0 * 512 * 2048);
  // Activation work is O(d_ff), not 2·d_model·d_ff (the tutorial's error 2): bias adds + F.
  EXPECT_DOUBLE_EQ(relu.forward.elementwise, 2048 + 512 + 2048);
  EXPECT_DOUBLE_EQ(relu.f32.weights, 4.0 * 2'099'712);
  EXPECT_DOUBLE_EQ(relu.f32.adam, 8.0 * 2'099'712);
  EXPECT_DOUBLE_EQ(relu.f32.activations, 4.0 * 8 * (512 + 2048 + 2048));
  EXPECT_DOUBLE_EQ(relu.bf16.activations, relu.f32.activations / 2);
  const FFNCost swiglu = ffn_cost(variant_config("swiglu", 512, 1365, false), 1);
  EXPECT_DOUBLE_EQ(swiglu.forward.matmul, 2.0 * 512 * 2 * 1365 + 2.0 * 1365 * 512);
}

TEST(Costs, InvalidConfigsAreRejected) {
  FFNConfig c = variant_config("moe", 16, 32, true);
  c.moe.num_experts = 4;
  c.moe.top_k = 5;
  EXPECT_THROW(ffn_cost(c, 1), Error);
  EXPECT_THROW(count_params(variant_config("relu", 16, 0, true)), Error);
  EXPECT_THROW(make_ffn(c), Error);
}

// Routings whose experts per token vary are costed at their mean: ReLU routing at N·(1 − S*),
// expert choice at c·k (capacity factor c, 1 when 0); top-k at k.
TEST(Costs, RoutingFamiliesCostTheirMeanExpertsPerToken) {
  FFNConfig topk = variant_config("moe", 64, 32, false);
  topk.moe.num_experts = 8;
  topk.moe.top_k = 2;
  const FFNConfig expert = expert_config(topk);
  const double per_expert = ffn_cost(expert, 1).forward.matmul;
  const double router = 2.0 * 64 * 8;
  auto experts_costed = [&](const FFNConfig& c) {
    return (ffn_cost(c, 1).forward.matmul - router) / per_expert;
  };
  EXPECT_DOUBLE_EQ(experts_costed(topk), 2.0);
  FFNConfig relu = topk;
  relu.moe.routing = RoutingKind::relu;
  relu.moe.normalize = false;
  relu.moe.target_sparsity = 0.5f;
  EXPECT_DOUBLE_EQ(experts_costed(relu), 4.0);
  FFNConfig ec = topk;
  ec.moe.routing = RoutingKind::expert_choice;
  ec.moe.normalize = false;
  EXPECT_DOUBLE_EQ(experts_costed(ec), 2.0);
  EXPECT_EQ(ffn_cost(ec, 1).active_params, ffn_cost(topk, 1).active_params);
  ec.moe.capacity_factor = 1.5;
  EXPECT_DOUBLE_EQ(experts_costed(ec), 3.0);
  EXPECT_GT(ffn_cost(ec, 1).active_params, ffn_cost(topk, 1).active_params);
  // Soft MoE: E·p slots a sequence of S (the tokens given): E·p/S experts a token, beside the
  // logits, dispatch and combine products (2·E·p·D each); its parameters are the layer's.
  FFNConfig soft = topk;
  soft.moe.routing = RoutingKind::soft;
  soft.moe.slots = 4;
  soft.moe.aux_coef = 0.0f;
  const FFNCost sc = ffn_cost(soft, 16);
  EXPECT_DOUBLE_EQ(sc.forward.matmul, 6.0 * 64 * 32 + 2.0 * per_expert);
  std::int64_t trained = 0;
  const auto layer = make_ffn(soft, 0);
  for (const auto& p : layer->parameters().list()) trained += shape_numel(p.shape);
  EXPECT_EQ(count_params(soft), trained);
  EXPECT_DOUBLE_EQ(experts_per_token(soft, 16), 2.0);
  EXPECT_DOUBLE_EQ(experts_per_token(ec, 16), 3.0);
  EXPECT_DOUBLE_EQ(experts_per_token(relu, 16), 4.0);
  EXPECT_DOUBLE_EQ(experts_per_token(variant_config("relu", 64, 32, false), 16), 0.0);
  // A Transformer costs Soft MoE over its own sequence: over 16 tokens the FFN forward FLOPs per
  // token equal the layer's at 16 tokens (not E·p experts a token, as a sequence of 1 would).
  LMConfig lm;
  lm.d_model = 64;
  lm.heads = 2;
  lm.layers = 2;
  lm.context = 16;
  lm.causal = false;
  lm.vocab = 257;
  lm.ffn = soft;
  EXPECT_DOUBLE_EQ(transformer_cost(lm, 16).ffn_forward_flops, 2 * sc.forward.total());
}
