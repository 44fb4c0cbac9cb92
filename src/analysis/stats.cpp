#include "ffnlab/analysis/stats.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <boost/math/distributions/chi_squared.hpp>
#include <boost/math/distributions/normal.hpp>
#include <boost/math/distributions/students_t.hpp>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <tuple>

#include "check.hpp"
#include "ffnlab/error.hpp"

namespace ffnlab {

double mean(std::span<const double> v) {
  return v.empty() ? NAN : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

namespace {
double squares_about_mean(std::span<const double> v) {
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s;
}
}  // namespace

double sample_std(std::span<const double> v) {
  if (v.size() < 2) return 0.0;
  return std::sqrt(squares_about_mean(v) / static_cast<double>(v.size() - 1));
}

double population_std(std::span<const double> v) {
  if (v.empty()) return 0.0;
  return std::sqrt(squares_about_mean(v) / static_cast<double>(v.size()));
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

double interquartile_spread(std::vector<double> v) {
  if (v.size() < 2) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t q = v.size() / 4;
  return (v[v.size() - 1 - q] - v[q]) / median(v);
}

bool MeanInterval::defined() const {
  return n >= 2;
}

MeanInterval mean_interval(std::span<const double> v, double level) {
  MeanInterval r;
  r.n = v.size();
  r.level = level;
  r.mean = mean(v);
  if (v.size() < 2) {
    r.low = r.high = NAN;
    return r;
  }
  const boost::math::students_t t(static_cast<double>(v.size() - 1));
  const double q = boost::math::quantile(t, 0.5 + level / 2);
  const double half = q * sample_std(v) / std::sqrt(static_cast<double>(v.size()));
  r.low = r.mean - half;
  r.high = r.mean + half;
  return r;
}

namespace {

// The two tests on a comparison's intervals (both defined): the difference interval excludes 0,
// else the equivalence interval lies within ±margin, else inconclusive.
Comparison verdict_of(const PairedComparison& c) {
  if (c.ci95.high < 0) return Comparison::better;
  if (c.ci95.low > 0) return Comparison::worse;
  if (c.ci90.low > -c.margin && c.ci90.high < c.margin) return Comparison::equivalent;
  return Comparison::inconclusive;
}

}  // namespace

PairedComparison compare_paired(std::span<const double> d, double margin) {
  PairedComparison c;
  c.margin = margin;
  c.ci95 = mean_interval(d, 0.95);
  c.ci90 = mean_interval(d, 0.90);
  c.verdict = c.ci95.defined() ? verdict_of(c) : Comparison::one_value;
  return c;
}

namespace {

const boost::math::normal kStandardNormal;

double normal_cdf(double z) {
  return boost::math::cdf(kStandardNormal, z);
}

double normal_quantile(double p) {
  return boost::math::quantile(kStandardNormal, p);
}

// A sub-density on an evenly spaced grid over [-half, half], with Simpson weights: the density
// of the score S_k = Z_k·√t_k on the paths that have not crossed a boundary yet.
struct GridDensity {
  static constexpr int kPoints = 1201;  // odd, for Simpson's rule
  double half = 0;
  std::vector<double> x, weighted;  // the points, and density × Simpson weight at each

  void set(double h, const std::function<double(double)>& density) {
    half = h;
    x.resize(kPoints);
    weighted.resize(kPoints);
    const double step = 2 * h / (kPoints - 1);
    for (int i = 0; i < kPoints; ++i) {
      x[static_cast<std::size_t>(i)] = -h + step * i;
      const double w = (i == 0 || i == kPoints - 1) ? 1 : (i % 2 ? 4 : 2);
      weighted[static_cast<std::size_t>(i)] =
          density(x[static_cast<std::size_t>(i)]) * w * step / 3;
    }
  }
};

}  // namespace

std::vector<double> obrien_fleming_bounds(std::span<const double> fractions, double alpha) {
  const double z = normal_quantile(1 - alpha / 2);
  auto spent = [&](double t) { return 2 - 2 * normal_cdf(z / std::sqrt(t)); };
  std::vector<double> bounds;
  GridDensity f;
  double previous_t = 0, previous_spent = 0;
  for (double t : fractions) {
    const double target = spent(t) - previous_spent;
    double bound = 0;
    if (bounds.empty()) {
      bound = normal_quantile(1 - target / 2);
      const double sd = std::sqrt(t);
      f.set(bound * sd, [sd](double s) {
        return std::exp(-0.5 * (s / sd) * (s / sd)) / (sd * std::sqrt(2 * M_PI));
      });
    } else {
      const double sd = std::sqrt(t - previous_t);  // of the increment since the last look
      const double root_t = std::sqrt(t);
      // The chance of crossing at this look (and not before) for a boundary c: decreasing in c.
      auto crossing = [&](double c) {
        const double b = c * root_t;
        double p = 0;
        for (std::size_t i = 0; i < f.x.size(); ++i)
          p += f.weighted[i] * (normal_cdf((f.x[i] - b) / sd) + normal_cdf((-b - f.x[i]) / sd));
        return p;
      };
      double lo = 0, hi = 40;
      for (int it = 0; it < 100 && hi - lo > 1e-10; ++it) {
        const double mid = (lo + hi) / 2;
        (crossing(mid) > target ? lo : hi) = mid;
      }
      bound = (lo + hi) / 2;
      const GridDensity before = f;
      f.set(bound * root_t, [&](double s) {
        double density = 0;
        for (std::size_t i = 0; i < before.x.size(); ++i) {
          const double u = (s - before.x[i]) / sd;
          density += before.weighted[i] * std::exp(-0.5 * u * u);
        }
        return density / (sd * std::sqrt(2 * M_PI));
      });
    }
    bounds.push_back(bound);
    previous_t = t;
    previous_spent = spent(t);
  }
  return bounds;
}

std::string seeds_text(const SequentialDesign& design) {
  if (design.first == design.cap)
    return fmt::format("{} seed{}", design.first, design.first == 1 ? "" : "s");
  return fmt::format("{} to {} seeds", design.first, design.cap);
}

std::vector<double> sequential_t_bounds(const SequentialDesign& design, double alpha, int paths) {
  if (design.first < 2 || design.cap < design.first || !(alpha > 0 && alpha < 1) || paths < 1)
    throw Error(
        fmt::format("[stats] a sequential design needs 2 <= first ({}) <= cap ({}), "
                    "alpha ({}) in (0, 1) and paths ({}) >= 1",
                    design.first, design.cap, alpha, paths));
  const double z = normal_quantile(1 - alpha / 2);
  auto spent = [&](int n) {
    return 2 - 2 * normal_cdf(z / std::sqrt(static_cast<double>(n) / design.cap));
  };
  // Simulated studies with no difference: each path's values one by one (unit normals, from a
  // generator of fixed seed, so that the bounds are the same on every machine).
  std::mt19937_64 generator(20261127);
  auto unit_normal = [&] {  // Box–Muller, written out: the library's distributions differ
    constexpr double kTwoPi = 6.283185307179586;
    const double u = (static_cast<double>(generator() >> 11) + 0.5) * 0x1.0p-53;
    const double v = static_cast<double>(generator() >> 11) * 0x1.0p-53;
    return std::sqrt(-2 * std::log(u)) * std::cos(kTwoPi * v);
  };
  const auto P = static_cast<std::size_t>(paths);
  std::vector<double> sum(P, 0.0), squares(P, 0.0);
  std::vector<bool> crossed(P, false);
  std::vector<double> bounds;
  for (int n = 1; n <= design.cap; ++n) {
    for (std::size_t p = 0; p < P; ++p) {
      const double x = unit_normal();
      sum[p] += x;
      squares[p] += x * x;
    }
    if (n < design.first) continue;
    // |t| of the paths still going, and the bound that the chance to be spent at this look
    // crosses: the (count)-th largest of them.
    std::vector<double> t;
    std::vector<std::size_t> which;
    for (std::size_t p = 0; p < P; ++p) {
      if (crossed[p]) continue;
      const double m = sum[p] / n;
      const double var = (squares[p] - n * m * m) / (n - 1);
      t.push_back(std::abs(m) / std::sqrt(var / n));
      which.push_back(p);
    }
    const double target = spent(n) - (n == design.first ? 0 : spent(n - 1));
    const auto count = static_cast<std::size_t>(std::llround(target * static_cast<double>(P)));
    if (count == 0) {  // nothing to spend at this look: no value of |t| decides
      bounds.push_back(INFINITY);
      continue;
    }
    if (count >= t.size()) {  // everything left is spent: every path stops here
      bounds.push_back(0);
      for (std::size_t p : which) crossed[p] = true;
      continue;
    }
    std::vector<double> sorted = t;
    const auto kth = sorted.begin() + static_cast<std::ptrdiff_t>(count);
    std::nth_element(sorted.begin(), kth, sorted.end(), std::greater<>());
    // Between the count-th and (count+1)-th largest, so that exactly `count` paths cross.
    const double above = *std::min_element(sorted.begin(), kth);
    const double bound = (above + *kth) / 2;
    for (std::size_t i = 0; i < t.size(); ++i)
      if (t[i] >= bound) crossed[which[i]] = true;
    bounds.push_back(bound);
  }
  return bounds;
}

double sequential_bound(const SequentialDesign& design, int n, double alpha) {
  // The bounds of each design, computed once (well under a second; the study asks many times).
  static std::mutex mutex;
  static std::map<std::tuple<int, int, double>, std::vector<double>> computed;
  std::lock_guard lock(mutex);
  auto& bounds = computed[{design.first, design.cap, alpha}];
  if (bounds.empty()) bounds = sequential_t_bounds(design, alpha);
  return bounds[static_cast<std::size_t>(std::clamp(n, design.first, design.cap) - design.first)];
}

namespace {

// The interval mean ± bound · s/√n, with the two-sided level that bound has for n − 1 degrees
// of freedom alone.
MeanInterval interval_at_bound(std::span<const double> v, double bound) {
  MeanInterval r;
  r.n = v.size();
  r.mean = mean(v);
  const double half = bound * sample_std(v) / std::sqrt(static_cast<double>(v.size()));
  r.low = r.mean - half;
  r.high = r.mean + half;
  const boost::math::students_t t(static_cast<double>(v.size() - 1));
  r.level = 1 - 2 * boost::math::cdf(boost::math::complement(t, bound));
  return r;
}

}  // namespace

PairedComparison compare_sequential(std::span<const double> d, double margin,
                                    const SequentialDesign& design) {
  const int n = static_cast<int>(d.size());
  if (n < design.first || n < 2) return compare_paired(d, margin);
  if (n > design.cap)
    throw Error(fmt::format("[stats] {} values are beyond the design's cap of {}", n, design.cap));
  PairedComparison c;
  c.margin = margin;
  c.ci95 = interval_at_bound(d, sequential_bound(design, n, design.alpha));
  c.ci90 = interval_at_bound(d, sequential_bound(design, n, 2 * design.alpha));
  c.verdict = verdict_of(c);
  return c;
}

double spread_upper_bound(std::span<const double> v, double level) {
  if (v.size() < 2) return 0;
  const double dof = static_cast<double>(v.size() - 1);
  const boost::math::chi_squared chi(dof);
  return sample_std(v) * std::sqrt(dof / boost::math::quantile(chi, 1 - level));
}

bool narrow_by_chance(std::span<const double> v, double expected, double chance) {
  if (v.size() < 2 || !(expected > 0)) return false;
  const double dof = static_cast<double>(v.size() - 1);
  const double s = sample_std(v);
  const boost::math::chi_squared chi(dof);
  return boost::math::cdf(chi, dof * s * s / (expected * expected)) < chance;
}

namespace {

// Whether n paired values of this mean and spread would decide with the bounds (on |t|) of
// the difference test and of the equivalence test.
bool decides(double mean_abs, double spread, double margin, int n, double bound,
             double equivalence_bound) {
  const double se = spread / std::sqrt(static_cast<double>(n));
  return bound * se < mean_abs || equivalence_bound * se < margin - mean_abs;
}

double t_quantile(int n, double level) {
  return boost::math::quantile(boost::math::students_t(static_cast<double>(n - 1)),
                               0.5 + level / 2);
}

}  // namespace

int values_to_decide(std::span<const double> d, double margin, int limit) {
  const double s = spread_upper_bound(d);
  if (d.size() < 2 || !(s > 0)) return 0;
  const double m = std::abs(mean(d));
  for (int n = 2; n <= limit; ++n)
    if (decides(m, s, margin, n, t_quantile(n, 0.95), t_quantile(n, 0.90))) return n;
  return limit + 1;
}

int values_to_decide(std::span<const double> d, double margin, const SequentialDesign& design) {
  const double s = spread_upper_bound(d);
  if (d.size() < 2 || !(s > 0)) return 0;
  const double m = std::abs(mean(d));
  for (int n = std::max(static_cast<int>(d.size()), design.first); n <= design.cap; ++n)
    if (decides(m, s, margin, n, sequential_bound(design, n, design.alpha),
                sequential_bound(design, n, 2 * design.alpha)))
      return n;
  return design.cap + 1;
}

bool SlopeInterval::defined() const {
  return !std::isnan(low) && !std::isnan(high);
}

SlopeInterval slope_interval(std::span<const double> x,
                             const std::vector<std::vector<double>>& groups, double level) {
  check(x.size() == groups.size(), "slope_interval: {} positions for {} groups", x.size(),
        groups.size());
  SlopeInterval r;
  r.level = level;
  r.low = r.high = NAN;
  const std::size_t k = x.size();
  if (k < 2) {
    r.slope = NAN;
    return r;
  }
  const double x_mean = mean(x);
  double sxx = 0;
  for (double xi : x) sxx += (xi - x_mean) * (xi - x_mean);
  if (!(sxx > 0)) {
    r.slope = NAN;
    return r;
  }
  double variance = 0, welch_denominator = 0;
  bool every_group_has_spread = true;
  for (std::size_t i = 0; i < k; ++i) {
    const double c = (x[i] - x_mean) / sxx;
    r.slope += c * mean(groups[i]);
    const auto n = static_cast<double>(groups[i].size());
    if (groups[i].size() < 2) {
      every_group_has_spread = false;
      continue;
    }
    const double s = sample_std(groups[i]);
    const double term = c * c * s * s / n;
    variance += term;
    welch_denominator += term * term / (n - 1);
  }
  if (!every_group_has_spread || !(variance > 0)) return r;
  r.degrees_of_freedom = variance * variance / welch_denominator;
  const boost::math::students_t t(r.degrees_of_freedom);
  const double half = boost::math::quantile(t, 0.5 + level / 2) * std::sqrt(variance);
  r.low = r.slope - half;
  r.high = r.slope + half;
  return r;
}

}  // namespace ffnlab
