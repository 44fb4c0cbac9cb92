#include "ffnlab/analysis/stats.hpp"

#include <algorithm>
#include <boost/math/distributions/students_t.hpp>
#include <cmath>
#include <numeric>

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

PairedComparison compare_paired(std::span<const double> d, double margin) {
  PairedComparison c;
  c.margin = margin;
  c.ci95 = mean_interval(d, 0.95);
  c.ci90 = mean_interval(d, 0.90);
  if (!c.ci95.defined())
    c.verdict = Comparison::one_value;
  else if (c.ci95.high < 0)
    c.verdict = Comparison::better;
  else if (c.ci95.low > 0)
    c.verdict = Comparison::worse;
  else if (c.ci90.low > -margin && c.ci90.high < margin)
    c.verdict = Comparison::equivalent;
  else
    c.verdict = Comparison::inconclusive;
  return c;
}

int values_to_decide(std::span<const double> d, double margin, int limit) {
  const double s = sample_std(d);
  if (d.size() < 2 || !(s > 0)) return 0;
  const double m = std::abs(mean(d));
  for (int n = 2; n <= limit; ++n) {
    const boost::math::students_t t(static_cast<double>(n - 1));
    const double se = s / std::sqrt(static_cast<double>(n));
    if (boost::math::quantile(t, 0.975) * se < m) return n;          // a difference shown
    if (boost::math::quantile(t, 0.95) * se < margin - m) return n;  // equivalence shown
  }
  return limit + 1;
}

}  // namespace ffnlab
