// The Transformer LM: the fast model's loss against the double reference model, and every
// parameter's gradient against central differences of the reference (routing held for MoE,
// dropout masks shared through the counter-based stream). Also the tutorial's 6-layer encoder.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/layers/ref/transformer_lm_ref.hpp"
#include "ffnlab/layers/transformer_lm.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/loss.hpp"

using namespace ffnlab;

namespace {

struct Case {
  const char* what;
  LMConfig config;
};

std::vector<Case> cases() {
  LMConfig base;
  base.vocab = 11;
  base.d_model = 8;
  base.layers = 2;
  base.heads = 2;
  base.context = 6;
  base.ffn = variant_config("swiglu", 8, 12, true);
  base.init_std = 0.f;  // torch's larger defaults: more signal for the central differences
  std::vector<Case> out;
  {
    LMConfig c = base;
    c.dropout = 0.2f;
    out.push_back({"pre-norm layernorm learned tied swiglu dropout", c});
  }
  {
    LMConfig c = base;
    c.pre_norm = false;
    c.final_norm = false;
    c.norm = NormKind::rmsnorm;
    c.positions = PositionKind::sinusoidal;
    c.tied_head = false;
    c.attn_bias = false;
    c.causal = false;
    c.ffn = variant_config("relu", 8, 16, false);
    out.push_back({"post-norm rmsnorm sinusoidal untied encoder relu, targets ignored", c});
  }
  {
    LMConfig c = base;
    c.positions = PositionKind::rope;
    c.norm = NormKind::rmsnorm;
    c.ffn = variant_config("moe", 8, 6, false);
    c.ffn.moe.num_experts = 4;
    c.ffn.moe.top_k = 2;
    c.ffn.moe.aux_coef = 0.05;
    c.ffn.moe.z_coef = 0.01;
    c.ffn.moe.num_shared = 1;
    out.push_back({"rope moe with shared expert and aux losses", c});
  }
  {  // top-p with its entropy ("dynamic") loss
    LMConfig c = base;
    c.ffn = variant_config("moe", 8, 6, true);
    c.ffn.moe.num_experts = 4;
    c.ffn.moe.top_k = 2;
    c.ffn.moe.routing = RoutingKind::top_p;
    c.ffn.moe.top_p = 0.6f;
    c.ffn.moe.normalize = false;
    c.ffn.moe.entropy_coef = 0.05f;
    out.push_back({"top-p moe with the entropy loss", c});
  }
  {  // ReLU routing with its L1 loss (a coefficient large enough to show in the gradients)
    LMConfig c = base;
    c.ffn = variant_config("moe", 8, 6, true);
    c.ffn.moe.num_experts = 4;
    c.ffn.moe.top_k = 2;
    c.ffn.moe.routing = RoutingKind::relu;
    c.ffn.moe.normalize = false;
    c.ffn.moe.aux_coef = c.ffn.moe.z_coef = 0.0f;
    c.ffn.moe.l1_coef_init = 0.3f;
    out.push_back({"relu-routed moe with its L1 loss", c});
  }
  {  // MoE++: the second layer's router adds the first layer's logits through its gate_map
    LMConfig c = base;
    c.ffn = variant_config("moe", 8, 6, true);
    c.ffn.moe.num_experts = 3;
    c.ffn.moe.top_k = 2;
    c.ffn.moe.constant_experts = c.ffn.moe.copy_experts = c.ffn.moe.zero_experts = 1;
    c.ffn.moe.aux_coef = 0.05;
    c.ffn.moe.gating_residual = true;
    out.push_back({"moe++ with gating residuals", c});
  }
  {
    LMConfig c = base;
    c.positions = PositionKind::none;
    c.layers = 1;
    c.ffn = variant_config("gelu", 8, 10, true);
    c.init_std = 0.3f;  // the GPT-2 initialisation path (biases zero, matrices normal)
    out.push_back({"no positions, one layer, gelu", c});
  }
  return out;
}

}  // namespace

TEST(TransformerLM, MatchesReferenceAndCentralDifferences) {
  const std::int64_t S = 5, B = 2, T = B * S;
  std::uint64_t seed = 3;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    TransformerLM lm(c.config, seed++);
    // Scale the embeddings up so that the gradient test sees more than the initial noise.
    lm.parameters().at("model.embed_tokens.weight").value.fill(0.f);
    {
      const Tensor r = test::random_tensor({c.config.vocab, c.config.d_model}, seed++, 0.7f);
      std::copy(r.f32(), r.f32() + r.numel(),
                lm.parameters().at("model.embed_tokens.weight").value.f32());
    }
    std::vector<std::int32_t> ids(T), targets(T);
    for (std::int64_t t = 0; t < T; ++t) {
      ids[t] = static_cast<std::int32_t>((t * 7 + 2) % c.config.vocab);
      targets[t] = static_cast<std::int32_t>((t * 3 + 5) % c.config.vocab);
      // The encoder as the masked objective trains it: most positions predict nothing.
      if (!c.config.causal && t % 3 != 1) targets[t] = kIgnoreTarget;
    }
    lm.set_dropout_stream(99, 4);
    lm.parameters().zero_grad();
    const double loss = lm.forward(ids, targets, S, true) + lm.aux_loss();
    lm.backward(1.f);

    ref::TransformerLM<double> r;
    r.config = c.config;
    r.dropout_seed = 99;
    r.dropout_stream = 4;
    r.train = true;
    for (const auto& p : lm.parameters().list())
      r.params[p.name] = test::to_vector<double>(p.value);
    const double ref_loss = r.forward(ids, targets, S);
    EXPECT_NEAR(loss, ref_loss, 2e-5 * std::max(1.0, std::fabs(ref_loss)));
    r.hold_routing = true;

    for (const auto& p : lm.parameters().list()) {
      if (!p.trainable) continue;
      auto& theta = r.params.at(p.name);
      const auto analytic = test::to_vector<double>(p.grad);
      test::expect_gradient(
          theta, analytic, [&] { return r.forward(ids, targets, S); },
          test::sample_indices(theta.size(), 6), 3e-5, 2e-3, p.name.c_str());
    }
  }
}

// One ReLU layer, d_model 8, 2 heads, context 4, a vocabulary of 7.
static LMConfig tiny_lm() {
  LMConfig c;
  c.vocab = 7;
  c.d_model = 8;
  c.heads = 2;
  c.layers = 1;
  c.context = 4;
  c.ffn = variant_config("relu", 8, 8, true);
  return c;
}

TEST(TransformerLM, RejectsBadInput) {
  const LMConfig c = tiny_lm();
  TransformerLM lm(c, 1);
  const std::vector<std::int32_t> five{1, 2, 3, 4, 5}, six{1, 2, 3, 4, 5, 6}, bad{1, 2, 9, 1};
  EXPECT_THROW(lm.forward(five, {}, 5, false), Error);  // longer than the context
  EXPECT_THROW(lm.forward(five, {}, 2, false), Error);  // not whole sequences
  EXPECT_THROW(lm.forward(bad, {}, 4, false), Error);   // token outside the vocabulary
  EXPECT_THROW(lm.forward(six, five, 3, true), Error);  // targets do not match
  LMConfig wrong = c;
  wrong.heads = 3;
  EXPECT_THROW(TransformerLM(wrong, 1), Error);
  wrong = c;
  wrong.ffn.d_model = 16;
  EXPECT_THROW(TransformerLM(wrong, 1), Error);
}

// The tutorial's encoder: 6 post-norm layers, d_model 512, 8 heads, ReLU FFN 2048, batch 64,
// sequence 100, bidirectional, here with the residual around attention that the tutorial forgot.
TEST(TransformerLM, TutorialEncoderRunsForwardAndBackward) {
  LMConfig c = tutorial_encoder_config();
  c.dropout = 0.1f;
  TransformerLM lm(c, 42);
  const std::int64_t B = 64, S = 100;
  std::vector<std::int32_t> ids(B * S), targets(B * S);
  std::mt19937 rng(1);
  for (auto& v : ids) v = static_cast<std::int32_t>(rng() % 256);
  for (auto& v : targets) v = static_cast<std::int32_t>(rng() % 256);
  lm.parameters().zero_grad();
  const double loss = lm.forward(ids, targets, S, true);
  lm.backward();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 4.0);  // about log(256) = 5.5 for random targets
  double sq = 0;
  const Tensor& g = lm.parameters().grads();
  for (std::int64_t i = 0; i < g.numel(); ++i) sq += static_cast<double>(g.f32()[i]) * g.f32()[i];
  EXPECT_TRUE(std::isfinite(sq));
  EXPECT_GT(sq, 0.0);
  // Every block's attention received a gradient (the residual path reaches all of them).
  for (int l = 0; l < 6; ++l) {
    const Tensor& dq =
        lm.parameters().at("model.layers." + std::to_string(l) + ".self_attn.q_proj.weight").grad;
    double s = 0;
    for (std::int64_t i = 0; i < dq.numel(); ++i) s += std::fabs(dq.f32()[i]);
    EXPECT_GT(s, 0.0) << "layer " << l;
  }
}

// From weight_packing_min_rows() rows the model's attention projections, dense FFNs, shared
// experts and head read their weights packed: the same loss and gradients as plain, up to the
// order of the sums, in f32 and native bf16, two steps with the weights changed between them.
TEST(TransformerLM, PackedWeightsTrainLikeThePlainOnes) {
  const auto saved = weight_packing_min_rows();
  std::vector<Precision> precisions{Precision::f32};
  if (converts_operands_once(Precision::bf16)) precisions.push_back(Precision::bf16);
  const std::int64_t S = 5, B = 2, T = B * S;
  std::uint64_t seed = 40;
  for (Precision precision : precisions)
    for (const Case& c : cases()) {
      SCOPED_TRACE(std::string(c.what) + " " + std::string(enum_name(precision)));
      TransformerLM plain(c.config, seed), packed(c.config, seed);
      ++seed;
      plain.set_precision(precision);
      packed.set_precision(precision);
      std::vector<std::int32_t> ids(T), targets(T);
      for (std::int64_t t = 0; t < T; ++t) {
        ids[t] = static_cast<std::int32_t>((t * 5 + 1) % c.config.vocab);
        targets[t] = static_cast<std::int32_t>((t * 3 + 2) % c.config.vocab);
      }
      for (int step = 0; step < 2; ++step) {
        double loss[2];
        int i = 0;
        for (TransformerLM* lm : {&plain, &packed}) {
          set_weight_packing_min_rows(lm == &plain ? 0 : T);
          const auto before = matmul_packings();
          lm->set_dropout_stream(7, step);
          lm->parameters().zero_grad();
          loss[i++] = lm->forward(ids, targets, S, true) + lm->aux_loss();
          lm->backward(1.f);
          // Attention (4 a layer) and the head (2) at least; dense FFNs and shared experts too.
          if (lm == &packed)
            EXPECT_GE(matmul_packings() - before, 4 * c.config.layers + 2);
          else
            EXPECT_EQ(matmul_packings(), before);
        }
        set_weight_packing_min_rows(saved);
        EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::abs(loss[0]));
        const Tensor& g0 = plain.parameters().grads();
        const Tensor& g1 = packed.parameters().grads();
        double scale = 0;
        for (std::int64_t k = 0; k < g0.numel(); ++k)
          scale = std::max(scale, double(std::abs(g0.f32()[k])));
        for (std::int64_t k = 0; k < g0.numel(); ++k)
          ASSERT_NEAR(g1.f32()[k], g0.f32()[k], 1e-5 * scale) << "step " << step << " at " << k;
        for (TransformerLM* lm : {&plain, &packed}) {  // an optimizer step's worth of change
          Tensor& v = lm->parameters().values();
          for (std::int64_t k = 0; k < v.numel(); ++k) v.f32()[k] += 0.01f * std::sin(k + 0.5f);
        }
      }
    }
}

// A training forward that throws part way (a token outside the vocabulary, found by the
// embedding) leaves no backward: the last forward's activations and the new targets do not
// belong together.
TEST(TransformerLM, AFailedForwardLeavesNoBackward) {
  TransformerLM lm(tiny_lm(), 1);
  const std::vector<std::int32_t> ids{1, 2, 3, 4}, bad{1, 2, 9, 1}, targets{2, 3, 4, 5};
  lm.forward(ids, targets, 4, true);
  lm.backward();  // the training forward's backward runs
  EXPECT_THROW(lm.forward(bad, targets, 4, true), Error);
  EXPECT_NE(test::error_of([&] { lm.backward(); }).find("backward needs a training forward"),
            std::string::npos);
}
