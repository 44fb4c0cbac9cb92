#include "ffnlab/analysis/stats.hpp"

#include <algorithm>
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

}  // namespace ffnlab
