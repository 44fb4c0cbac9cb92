// Optimizers against the update rules written out in double (PyTorch's definitions), the
// schedule at its corners, and the global norm.
#include <gtest/gtest.h>

#include <cmath>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/train/optimizer.hpp"
#include "ffnlab/train/schedule.hpp"

using namespace ffnlab;

namespace {

ParameterSet make_params() {
  ParameterSet ps;
  ps.declare("w", {3, 4});           // decayed
  ps.declare("b", {4});              // not decayed
  ps.declare("frozen", {2}, false);  // not trainable
  ps.allocate();
  const Tensor r = test::random_tensor({ps.count()}, 5);
  std::copy(r.f32(), r.f32() + r.numel(), ps.values().f32());
  return ps;
}

bool decay_matrices(const Parameter& p) {
  return p.shape.size() == 2;
}

}  // namespace

TEST(Optimizer, MatchesTheUpdateRulesInDouble) {
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adam, OptimizerKind::adamw}) {
    SCOPED_TRACE(enum_name(kind));
    ParameterSet ps = make_params();
    OptimizerConfig c;
    c.kind = kind;
    c.weight_decay = 0.1f;
    c.momentum = 0.9f;
    Optimizer opt(c, ps, decay_matrices);
    const std::int64_t n = ps.count();
    std::vector<double> w(ps.values().f32(), ps.values().f32() + n), m(n, 0), v(n, 0);
    const std::vector<double> w0 = w;
    for (int step = 1; step <= 4; ++step) {
      const Tensor g = test::random_tensor({n}, 100 + step);
      std::copy(g.f32(), g.f32() + n, ps.grads().f32());
      const float lr = 0.01f * static_cast<float>(step);
      opt.step(lr);
      for (std::int64_t i = 0; i < n; ++i) {
        if (i >= 16) continue;  // frozen
        const double wd = i < 12 ? 0.1 : 0.0;
        double gi = g.f32()[i];
        if (kind == OptimizerKind::sgd) {
          gi += wd * w[i];
          m[i] = step == 1 ? gi : 0.9 * m[i] + gi;
          w[i] -= lr * m[i];
        } else {
          if (kind == OptimizerKind::adam)
            gi += wd * w[i];
          else
            w[i] *= 1 - lr * wd;
          m[i] = 0.9 * m[i] + 0.1 * gi;
          v[i] = 0.95 * v[i] + 0.05 * gi * gi;
          const double mh = m[i] / (1 - std::pow(0.9, step)),
                       vh = v[i] / (1 - std::pow(0.95, step));
          w[i] -= lr * mh / (std::sqrt(vh) + 1e-8);
        }
      }
    }
    for (std::int64_t i = 0; i < n; ++i) {
      if (i >= 16)
        EXPECT_EQ(ps.values().f32()[i], static_cast<float>(w0[i])) << "frozen " << i;
      else
        EXPECT_NEAR(ps.values().f32()[i], w[i], 2e-6) << i;
    }
  }
  EXPECT_EQ(parse_enum<OptimizerKind>("adamw"), OptimizerKind::adamw);
  EXPECT_THROW(parse_enum<OptimizerKind>("lion"), Error);
}

TEST(Optimizer, GlobalNormAndScale) {
  Tensor t = test::random_tensor({1000}, 3);
  double sq = 0;
  for (int i = 0; i < 1000; ++i) sq += static_cast<double>(t.f32()[i]) * t.f32()[i];
  EXPECT_NEAR(global_norm(t), std::sqrt(sq), 1e-9 * std::sqrt(sq));
  scale_buffer(t, 0.5f);
  EXPECT_NEAR(global_norm(t), 0.5 * std::sqrt(sq), 1e-6);
}

// A resume's question: from which step two lengths of one schedule give other rates.
TEST(Schedule, FirstRateChangeIsWhereTheLengthsPartWays) {
  const Schedule short_run{1.0f, 10, 110, 0.1f, DecayKind::cosine};
  Schedule long_run = short_run;
  long_run.steps = 220;
  EXPECT_EQ(first_rate_change(short_run, long_run, 10), -1);  // the warm-up is shared
  EXPECT_EQ(first_rate_change(short_run, long_run, 11), -1);  // both at the peak at step 10
  EXPECT_EQ(first_rate_change(short_run, long_run, 110), 11);
  EXPECT_EQ(first_rate_change(short_run, short_run, 110), -1);
  Schedule flat = short_run, flat_long = long_run;
  flat.decay = flat_long.decay = DecayKind::constant;
  EXPECT_EQ(first_rate_change(flat, flat_long, 110), -1);
}

TEST(Schedule, WarmupThenCosineToTheFloor) {
  Schedule s{1.0f, 10, 110, 0.1f, DecayKind::cosine};
  EXPECT_FLOAT_EQ(s.lr(0), 0.1f);
  EXPECT_FLOAT_EQ(s.lr(9), 1.0f);
  EXPECT_FLOAT_EQ(s.lr(10), 1.0f);
  EXPECT_NEAR(s.lr(60), 0.55f, 1e-6);  // half-way: (1 + 0.1) / 2
  EXPECT_NEAR(s.lr(110), 0.1f, 1e-6);
  for (int i = 11; i < 110; ++i) EXPECT_LT(s.lr(i), s.lr(i - 1));
  Schedule flat{1.0f, 0, 100, 0.1f, DecayKind::constant};
  EXPECT_FLOAT_EQ(flat.lr(50), 1.0f);
  EXPECT_THROW(parse_enum<DecayKind>("linear"), Error);
}
