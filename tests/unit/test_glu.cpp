// The gated product (GLU family, multi-branch): fast against reference, reference against
// central differences.
#include <gtest/gtest.h>

#include <set>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/glu.hpp"
#include "ffnlab/ops/ref/glu_ref.hpp"

using namespace ffnlab;

namespace {
struct Case {
  std::int64_t T, F;
  int branches;
  Act act;
};
const Case kCases[] = {{7, 37, 1, {Activation::silu}},
                       {1, 1031, 1, {Activation::gelu}},
                       {33, 5, 1, {Activation::sigmoid}},
                       {5, 19, 3, {Activation::relu}},
                       {4, 600, 2, {Activation::gelu_tanh}},
                       {3, 11, 1, {Activation::identity}},
                       {6, 29, 2, {Activation::gelu_quick}},
                       {9, 13, 4, {Activation::silu, 1.5f}},
                       {8, 17, 1, {Activation::tanh}},
                       {5, 23, 2, {Activation::relu2}},
                       // above the parallel grain, two column blocks and a remainder
                       {64, 700, 1, {Activation::silu}},
                       {40, 530, 2, {Activation::gelu}}};
}  // namespace

// The cases run every activation (a new one fails here until it has a row of kCases).
TEST(Glu, CasesRunEveryActivation) {
  std::set<Activation> seen;
  for (const auto& c : kCases) seen.insert(c.act.kind);
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(Activation::count));
}

TEST(Glu, FastMatchesReference) {
  std::uint64_t seed = 1;
  for (const auto& c : kCases) {
    const std::int64_t P = 2 * c.branches * c.F;
    const Tensor a = test::random_tensor({c.T, P}, seed++, 2.0f);
    const Tensor dh = test::random_tensor({c.T, c.F}, seed++);
    Tensor h({c.T, c.F}), da({c.T, P});
    glu_forward(h, a, c.act, c.branches);
    glu_backward(da, dh, a, c.act, c.branches);
    const auto a64 = test::to_vector<double>(a), dh64 = test::to_vector<double>(dh);
    std::vector<double> rh(c.T * c.F), rda(c.T * P);
    ref::glu_forward<double>(rh.data(), a64.data(), c.T, c.F, c.branches, c.act);
    ref::glu_backward<double>(rda.data(), dh64.data(), a64.data(), c.T, c.F, c.branches, c.act);
    EXPECT_LT(test::scaled_error(h.f32(), rh.data(), h.numel()), 2e-6)
        << enum_name(c.act.kind) << " n=" << c.branches;
    EXPECT_LT(test::scaled_error(da.f32(), rda.data(), da.numel()), 2e-6)
        << enum_name(c.act.kind) << " n=" << c.branches;
  }
}

// The gated backward takes act(g) and act'(g) together (kernels::value_grad for the activations
// that share an erf or a sigmoid between them): the same bits as the plain activation's forward
// and backward give, du = dh·act(g) and dg = (dh·u)·act'(g).
TEST(Glu, BackwardAgreesBitForBitWithThePlainActivation) {
  const std::int64_t T = 5, F = 300;
  std::vector<Act> acts{Act{Activation::silu, 1.5f}};  // every activation, and a swish-β
  for (int i = 0; i < static_cast<int>(Activation::count); ++i)
    acts.push_back(Act{static_cast<Activation>(i)});
  for (const Act act : acts) {
    SCOPED_TRACE(enum_name(act.kind));
    const Tensor a = test::random_tensor({T, 2 * F}, 7, 3.0f), dh = test::random_tensor({T, F}, 8);
    Tensor da({T, 2 * F});
    glu_backward(da, dh, a, act);
    Tensor g({T, F}), dhu({T, F}), value({T, F}), dg({T, F});
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t f = 0; f < F; ++f) {
        g.f32()[t * F + f] = a.f32()[t * 2 * F + f];
        dhu.f32()[t * F + f] = dh.f32()[t * F + f] * a.f32()[t * 2 * F + F + f];
      }
    activation_forward(value, g, act);
    activation_backward(dg, dhu, g, act);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t f = 0; f < F; ++f) {
        ASSERT_EQ(da.f32()[t * 2 * F + f], dg.f32()[t * F + f]) << t << "," << f;
        ASSERT_EQ(da.f32()[t * 2 * F + F + f], dh.f32()[t * F + f] * value.f32()[t * F + f])
            << t << "," << f;
      }
  }
}

TEST(Glu, ReferenceGradientMatchesCentralDifferences) {
  std::uint64_t seed = 100;
  for (const auto& c : kCases) {
    if (c.T * c.F > 2000) continue;
    const std::int64_t P = 2 * c.branches * c.F;
    auto a = test::to_vector<double>(test::random_tensor({c.T, P}, seed++, 2.0f));
    const auto dh = test::to_vector<double>(test::random_tensor({c.T, c.F}, seed++));
    std::vector<double> da(a.size()), h(c.T * c.F);
    ref::glu_backward<double>(da.data(), dh.data(), a.data(), c.T, c.F, c.branches, c.act);
    auto loss = [&] {  // L = Σ h ⊙ dh
      ref::glu_forward<double>(h.data(), a.data(), c.T, c.F, c.branches, c.act);
      double l = 0;
      for (std::size_t i = 0; i < h.size(); ++i) l += h[i] * dh[i];
      return l;
    };
    test::expect_gradient(a, da, loss, test::sample_indices(a.size(), 60), 1e-7, 1e-6, "da");
  }
}

TEST(Glu, RejectsMismatchedShapes) {
  Tensor h({2, 4}), a({2, 7});
  EXPECT_THROW(glu_forward(h, a, Act{}), Error);
  Tensor a2({2, 8});
  EXPECT_THROW(glu_forward(h, a2, Act{}, 0), Error);
  EXPECT_NO_THROW(glu_forward(h, a2, Act{}));
}
