// Activations: the fast kernels against the double reference, the reference's derivative against
// central differences, and the name table.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/ref/activation_ref.hpp"

using namespace ffnlab;

namespace {

std::vector<Act> all_acts() {
  std::vector<Act> out;
  for (int i = 0; i < static_cast<int>(Activation::count); ++i)
    out.push_back(Act{static_cast<Activation>(i)});
  out.push_back(Act{Activation::silu, 1.5f});
  return out;
}

// Inputs from -12 to 12, plus extremes where exp overflows and tiny values; more of them than
// one thread's grain, so the parallel path runs too.
Tensor inputs() {
  std::vector<float> v;
  for (int i = -12000; i <= 12000; ++i) v.push_back(i * 0.001f);
  for (float x : {-200.f, -90.f, -88.f, -30.f, 1e-7f, -1e-7f, 30.f, 88.f, 90.f, 200.f})
    v.push_back(x);
  return Tensor::from({static_cast<std::int64_t>(v.size())}, v);
}

}  // namespace

TEST(Activation, FastMatchesReference) {
  const Tensor x = inputs();
  const std::int64_t n = x.numel();
  for (const Act& act : all_acts()) {
    Tensor y({n}), dx({n});
    Tensor ones({n});
    ones.fill(1.0f);
    activation_forward(y, x, act);
    activation_backward(dx, ones, x, act);
    for (std::int64_t i = 0; i < n; ++i) {
      const double xi = x.f32()[i];
      const double ry = ref::activation<double>(act.kind, xi, act.beta);
      const double rg = ref::activation_grad<double>(act.kind, xi, act.beta);
      // Absolute 3e-7 plus 4 ulps relative: A&S erf and the exp-based tanh are accurate to
      // ~1.5e-7 absolute; exp itself to a few ulps.
      EXPECT_NEAR(y.f32()[i], ry, 3e-7 + 5e-7 * std::fabs(ry))
          << enum_name(act.kind) << "(" << xi << ")";
      EXPECT_NEAR(dx.f32()[i], rg, 3e-7 + 5e-7 * std::fabs(rg))
          << enum_name(act.kind) << "'(" << xi << ")";
    }
  }
}

TEST(Activation, BackwardMultipliesByUpstreamGradient) {
  const Tensor x = test::random_tensor({1000}, 1, 2.0f);
  const Tensor dy = test::random_tensor({1000}, 2);
  for (const Act& act : all_acts()) {
    Tensor dx({1000});
    activation_backward(dx, dy, x, act);
    for (int i = 0; i < 1000; ++i) {
      const double r = dy.f32()[i] * ref::activation_grad<double>(act.kind, x.f32()[i], act.beta);
      EXPECT_NEAR(dx.f32()[i], r, 1e-6 + 1e-6 * std::fabs(r));
    }
  }
}

TEST(Activation, ReferenceDerivativeMatchesCentralDifferences) {
  for (const Act& act : all_acts()) {
    for (double x = -6.0; x <= 6.0; x += 0.0625) {
      if ((act.kind == Activation::relu || act.kind == Activation::relu2) && std::fabs(x) < 1e-3)
        continue;  // the kink
      const double h = 1e-6;
      const double numeric = (ref::activation<double>(act.kind, x + h, act.beta) -
                              ref::activation<double>(act.kind, x - h, act.beta)) /
                             (2 * h);
      const double analytic = ref::activation_grad<double>(act.kind, x, act.beta);
      EXPECT_NEAR(analytic, numeric, 1e-8 + 1e-7 * std::fabs(numeric))
          << enum_name(act.kind) << "'(" << x << ")";
    }
  }
}

TEST(Activation, NamesRoundTripAndAliasesResolve) {
  for (int i = 0; i < static_cast<int>(Activation::count); ++i) {
    const auto a = static_cast<Activation>(i);
    EXPECT_EQ(parse_enum<Activation>(enum_name(a)), a);
  }
  EXPECT_EQ(parse_enum<Activation>("swish"), Activation::silu);
  EXPECT_EQ(parse_enum<Activation>("gelu_pytorch_tanh"), Activation::gelu_tanh);
  EXPECT_EQ(parse_enum<Activation>("gelu_new"), Activation::gelu_tanh);
  EXPECT_EQ(parse_enum<Activation>("quick_gelu"), Activation::gelu_quick);
  try {
    parse_enum<Activation>("selu");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown activation 'selu'"), std::string::npos);
  }
}

TEST(Activation, RejectsMismatchedSizes) {
  Tensor x({4}), y({5});
  EXPECT_THROW(activation_forward(y, x, Act{}), Error);
}

// The derivative from the output, for the activations where it is one (the layers then keep only
// their hidden activations): against the reference derivative at the input, on the fast kernels'
// own outputs.
TEST(Activation, DerivativeFromOutputMatchesReference) {
  const Tensor x = inputs();
  const std::int64_t n = x.numel();
  const Tensor dy = test::random_tensor({n}, 3);
  int covered = 0;
  for (const Act& act : all_acts()) {
    const bool expected = act.kind == Activation::relu || act.kind == Activation::sigmoid ||
                          act.kind == Activation::tanh;
    EXPECT_EQ(derivative_from_output(act), expected) << enum_name(act.kind);
    Tensor y({n}), dx({n});
    activation_forward(y, x, act);
    if (!expected) {
      EXPECT_THROW(activation_backward_from_output(dx, dy, y, act), Error);
      continue;
    }
    ++covered;
    activation_backward_from_output(dx, dy, y, act);
    for (std::int64_t i = 0; i < n; ++i) {
      const double r = dy.f32()[i] * ref::activation_grad<double>(act.kind, x.f32()[i], act.beta);
      // Where σ or tanh saturate, y is within a few ulps of 1 and 1 − y (or 1 − y²) keeps only
      // those ulps: an absolute error up to ~5e-7·|dy|, as in PyTorch, whose sigmoid and tanh
      // backward also take the output.
      EXPECT_NEAR(dx.f32()[i], r, 6e-7 * std::fabs(dy.f32()[i]) + 1e-6 * std::fabs(r))
          << enum_name(act.kind) << "'(" << x.f32()[i] << ")";
    }
  }
  EXPECT_EQ(covered, 3);
}
