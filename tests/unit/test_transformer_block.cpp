// A Transformer block's diagnostics: the residual branches' RMS it reports are those of the
// attention and FFN outputs it added, computed by the block's own parts run apart, and a
// forward made with diagnostics off leaves the last measured ones in place.
#include <gtest/gtest.h>

#include <cmath>

#include "../common/test_util.hpp"
#include "ffnlab/layers/transformer_block.hpp"

using namespace ffnlab;
using ffnlab::test::random_tensor;

namespace {

double rms(const Tensor& t) {
  double q = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) q += static_cast<double>(t.f32()[i]) * t.f32()[i];
  return std::sqrt(q / static_cast<double>(t.numel()));
}

Tensor sum(const Tensor& a, const Tensor& b) {
  Tensor y(a.shape());
  for (std::int64_t i = 0; i < a.numel(); ++i) y.f32()[i] = a.f32()[i] + b.f32()[i];
  return y;
}

}  // namespace

TEST(TransformerBlock, DiagnosticsMeasureTheBranchesOfTheLastMeasuredForward) {
  LMConfig c;
  c.d_model = 8;
  c.heads = 2;
  c.context = 6;
  c.ffn = variant_config("swiglu", 8, 12, true);
  const std::int64_t seq = 6, T = 2 * seq;
  const std::uint64_t seed = 5;
  TransformerBlock block(c, seed);

  // The block's parts, built apart with its seeds (pre-norm: h = x + attn(norm1(x)),
  // y = h + ffn(norm2(h))); the norms start at weight 1, bias 0.
  Norm norm1(c.norm, c.d_model, c.norm_eps), norm2(c.norm, c.d_model, c.norm_eps);
  Attention attn({c.d_model, c.heads, c.attn_bias, c.causal, false, c.rope_theta}, seed);
  auto ffn = make_ffn(c.ffn, seed + 1);

  const Tensor x = random_tensor({T, c.d_model}, 1);
  Tensor y, n1, a, n2, f;
  block.forward(y, x, seq, /*train=*/true, 0, 0);
  norm1.forward(n1, x);
  attn.forward(a, n1, seq, true);
  const Tensor h = sum(x, a);
  norm2.forward(n2, h);
  ffn->forward(f, n2, true);
  const Tensor y_apart = sum(h, f);
  ASSERT_EQ(y.numel(), y_apart.numel());
  for (std::int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.f32()[i], y_apart.f32()[i]) << i;

  const LayerDiagnostics first = block.diagnostics();
  EXPECT_EQ(first.residual_rms, rms(x));
  EXPECT_EQ(first.attention_rms, rms(a));
  EXPECT_EQ(first.ffn_rms, rms(f));
  EXPECT_GT(first.attention_rms, 0.0);

  // Off: another input changes the residual stream's RMS (read from the input the block keeps),
  // not the branches' of the forward that measured them.
  const Tensor x2 = random_tensor({T, c.d_model}, 2, 3.0f);
  block.set_diagnostics(false);
  block.forward(y, x2, seq, true, 0, 0);
  const LayerDiagnostics off = block.diagnostics();
  EXPECT_EQ(off.residual_rms, rms(x2));
  EXPECT_EQ(off.attention_rms, first.attention_rms);
  EXPECT_EQ(off.ffn_rms, first.ffn_rms);

  // On again: the branches of this forward.
  block.set_diagnostics(true);
  block.forward(y, x2, seq, true, 0, 0);
  EXPECT_NE(block.diagnostics().ffn_rms, first.ffn_rms);
  EXPECT_NE(block.diagnostics().attention_rms, first.attention_rms);
}
