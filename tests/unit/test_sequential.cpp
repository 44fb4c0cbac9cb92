// The sequential comparisons of analysis/stats.hpp: the group-sequential bounds against
// simulations of their own (another generator, another method), the repeated intervals, and
// the planning figures from an upper bound on the spread, worked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/error.hpp"

namespace ffnlab {
namespace {

// The O'Brien–Fleming-type spending of α = 0.05 up to information fraction t.
double spent(double t) {
  return std::erfc(1.959963984540054 / std::sqrt(t) / std::sqrt(2.0));
}

// The normal bounds by numerical integration against Brownian paths simulated here: the share
// of paths that first cross at each look is the α spent there.
TEST(Sequential, NormalBoundsSpendTheErrorAsTheFunctionSays) {
  const std::vector<double> t{0.5, 4.0 / 6, 5.0 / 6, 1.0};
  const std::vector<double> bounds = obrien_fleming_bounds(t, 0.05);
  ASSERT_EQ(bounds.size(), t.size());
  // The first look is one normal tail: 1.95996·√2 = 2.77181.
  EXPECT_NEAR(bounds[0], 2.77181, 1e-4);
  std::mt19937 generator(5);
  std::normal_distribution<double> normal;
  constexpr int kPaths = 400000;
  std::vector<int> crossed(t.size(), 0);
  for (int p = 0; p < kPaths; ++p) {
    double score = 0, before = 0;
    for (std::size_t k = 0; k < t.size(); ++k) {
      score += normal(generator) * std::sqrt(t[k] - before);
      before = t[k];
      if (std::abs(score / std::sqrt(t[k])) >= bounds[k]) {
        ++crossed[k];
        break;
      }
    }
  }
  double total = 0;
  for (std::size_t k = 0; k < t.size(); ++k) {
    const double expected = spent(t[k]) - (k == 0 ? 0 : spent(t[k - 1]));
    const double seen = crossed[k] / static_cast<double>(kPaths);
    // Four standard errors of a share of 400,000 paths.
    EXPECT_NEAR(seen, expected, 4 * std::sqrt(expected / kPaths) + 1e-4) << "look " << k;
    total += seen;
  }
  EXPECT_NEAR(total, 0.05, 4 * std::sqrt(0.05 * 0.95 / kPaths));
  // Later looks spend more, so the bounds fall towards the fixed test's 1.96.
  for (std::size_t k = 1; k < bounds.size(); ++k) EXPECT_LT(bounds[k], bounds[k - 1]);
  EXPECT_GT(bounds.back(), 1.96);
  EXPECT_LT(bounds.back(), 2.2);
}

// The t bounds: sequential t tests of two equal variants, simulated here with another
// generator, call a difference 5 % of the time over all the looks, and equivalence-side bounds
// (2α) about 10 %.
TEST(Sequential, TBoundsHoldTheErrorOverEveryLook) {
  const SequentialDesign design{3, 6, 0.05};
  for (double alpha : {0.05, 0.10}) {
    std::vector<double> bound;
    for (int n = design.first; n <= design.cap; ++n)
      bound.push_back(sequential_bound(design, n, alpha));
    for (std::size_t k = 1; k < bound.size(); ++k) EXPECT_LT(bound[k], bound[k - 1]);
    std::mt19937 generator(11);
    std::normal_distribution<double> normal;
    constexpr int kStudies = 60000;
    int wrong = 0;
    for (int s = 0; s < kStudies; ++s) {
      double sum = 0, squares = 0;
      for (int n = 1; n <= design.cap; ++n) {
        const double x = normal(generator);
        sum += x;
        squares += x * x;
        if (n < design.first) continue;
        const double mean = sum / n, var = (squares - n * mean * mean) / (n - 1);
        if (std::abs(mean) / std::sqrt(var / n) >= bound[static_cast<std::size_t>(n - design.first)]) {
          ++wrong;
          break;
        }
      }
    }
    EXPECT_NEAR(wrong / static_cast<double>(kStudies), alpha,
                4 * std::sqrt(alpha * (1 - alpha) / kStudies))
        << "alpha " << alpha;
  }
  // The bounds docs/evolve.md quotes. The first has a closed form: with 2 degrees of freedom
  // P(|t| ≥ c) = 1 − c/√(2 + c²), which at α(0.5) = 0.005574 gives c = 13.34.
  EXPECT_NEAR(sequential_bound(design, 3, 0.05), 13.34, 0.4);
  EXPECT_NEAR(sequential_bound(design, 4, 0.05), 5.41, 0.1);
  EXPECT_NEAR(sequential_bound(design, 5, 0.05), 3.68, 0.06);
  EXPECT_NEAR(sequential_bound(design, 6, 0.05), 2.97, 0.04);
  EXPECT_THROW(sequential_t_bounds(SequentialDesign{1, 6, 0.05}, 0.05), Error);
  EXPECT_THROW(sequential_t_bounds(SequentialDesign{4, 3, 0.05}, 0.05), Error);
  EXPECT_THROW(compare_sequential(std::vector<double>(7, 0.1), 0.02, design), Error);
  // With few seeds the t bounds are far above the normal ones (2 degrees of freedom at the
  // first look); with many they come close to them.
  const std::vector<double> z = obrien_fleming_bounds(std::vector<double>{0.5, 4.0 / 6, 5.0 / 6, 1},
                                                      0.05);
  EXPECT_GT(sequential_bound(design, 3, 0.05), 3 * z[0]);
  const SequentialDesign many{40, 80, 0.05};
  const std::vector<double> t = sequential_t_bounds(many, 0.05, 200000);
  std::vector<double> fractions;
  for (int n = 40; n <= 80; ++n) fractions.push_back(n / 80.0);
  const std::vector<double> normal_bounds = obrien_fleming_bounds(fractions, 0.05);
  EXPECT_NEAR(t.front() / normal_bounds.front(), 1.0, 0.08);
  EXPECT_NEAR(t.back() / normal_bounds.back(), 1.0, 0.05);
}

// A look's interval is mean ± bound·s/√n; below the first look the comparison is the fixed one.
TEST(Sequential, ALookUsesItsBoundsAndTheRulesOfThePairedComparison) {
  const SequentialDesign design{3, 6, 0.05};
  const std::vector<double> d{-0.05, -0.03, -0.04};  // mean −0.04, s = 0.01: t = 6.93
  const double half = sequential_bound(design, 3, 0.05) * 0.01 / std::sqrt(3.0);
  const PairedComparison c = compare_sequential(d, 0.02, design);
  EXPECT_NEAR(c.ci95.low, -0.04 - half, 1e-12);
  EXPECT_NEAR(c.ci95.high, -0.04 + half, 1e-12);
  // The bound at 3 seeds is far wider than the fixed 95 % interval's t of 4.30: this difference,
  // better by the fixed interval, is not decided at the first look.
  EXPECT_GT(half, 4.302653 * 0.01 / std::sqrt(3.0));
  EXPECT_EQ(compare_paired(d, 0.02).verdict, Comparison::better);
  EXPECT_EQ(c.verdict, Comparison::inconclusive);
  EXPECT_GT(c.ci95.level, 0.99);  // the nominal level of that bound alone
  // A large difference is decided at the first look.
  EXPECT_EQ(compare_sequential(std::vector<double>{-0.100, -0.101, -0.099}, 0.02, design).verdict,
            Comparison::better);
  EXPECT_EQ(compare_sequential(std::vector<double>{0.100, 0.101, 0.099}, 0.02, design).verdict,
            Comparison::worse);
  EXPECT_EQ(compare_sequential(std::vector<double>{0.0001, -0.0001, 0.0}, 0.02, design).verdict,
            Comparison::equivalent);
  // Two values, before the design's first look: the fixed comparison.
  const std::vector<double> two{-0.05, -0.04};
  EXPECT_EQ(compare_sequential(two, 0.02, design).ci95.high, compare_paired(two, 0.02).ci95.high);
}

// The upper bound on the spread, worked by hand: with 2 values the sample variance over σ² is
// χ² with 1 degree of freedom, i.e. Z², whose 10 % point is Φ⁻¹(0.55)² = 0.125661².
TEST(Sequential, PlansFromAnUpperBoundOnTheSpread) {
  const double b = 0.01 / std::sqrt(2.0);
  const std::vector<double> d{0.05 - b, 0.05 + b};  // mean 0.05, s = 0.01
  EXPECT_NEAR(spread_upper_bound(d), 0.01 / 0.125661, 1e-5);
  EXPECT_EQ(spread_upper_bound(std::vector<double>{0.1}), 0);
  // At s_up = 0.079580, a difference of 0.05 is shown when t(0.975, n − 1)·s_up/√n < 0.05:
  // n = 12, t = 2.2010: 0.05056; n = 13, t = 2.1788: 0.04809. (At the spread seen, 3 seeds.)
  EXPECT_EQ(values_to_decide(d, 0.02), 13);
  EXPECT_EQ(values_to_decide(std::vector<double>{0.01, 0.01}, 0.02), 0);
  EXPECT_EQ(values_to_decide(std::vector<double>{0.01}, 0.02), 0);
  EXPECT_EQ(values_to_decide(std::vector<double>{0.02 - 1, 0.02 + 1}, 0.02, 50), 51);
  // Under the design: the first n from here to the cap whose bound decides at s_up, or cap + 1.
  const SequentialDesign design{3, 6, 0.05};
  const std::vector<double> three{-0.05, -0.04, -0.045};
  const double s_up = spread_upper_bound(three);
  int expected = design.cap + 1;
  for (int n = 3; n <= design.cap; ++n)
    if (sequential_bound(design, n, 0.05) * s_up / std::sqrt(n) < 0.045) {
      expected = n;
      break;
    }
  EXPECT_EQ(values_to_decide(three, 0.02, design), expected);
  EXPECT_LE(expected, design.cap);  // 0.045 at a spread of 0.005 is decided by the cap
  EXPECT_EQ(values_to_decide(std::vector<double>{-0.05, 0.04, -0.01}, 0.001, design),
            design.cap + 1);
}

// χ² with 2 degrees of freedom has cdf 1 − e^(−x/2): with 3 values, a standard deviation below
// √(−ln 0.95)·σ = 0.2265·σ has a chance under 5 %.
TEST(Sequential, AnIntervalNarrowerThanTheSpreadSeenElsewhereIsNarrowByChance) {
  auto three = [](double s) { return std::vector<double>{-s, 0.0, s}; };  // sample std = s
  EXPECT_TRUE(narrow_by_chance(three(0.0002), 0.02));
  EXPECT_TRUE(narrow_by_chance(three(0.22 * 0.02), 0.02));
  EXPECT_FALSE(narrow_by_chance(three(0.23 * 0.02), 0.02));
  EXPECT_FALSE(narrow_by_chance(three(0.015), 0.02));
  EXPECT_FALSE(narrow_by_chance(three(0.0002), 0.0));  // nothing to compare with
  EXPECT_FALSE(narrow_by_chance(std::vector<double>{0.1}, 0.02));
}

}  // namespace
}  // namespace ffnlab
