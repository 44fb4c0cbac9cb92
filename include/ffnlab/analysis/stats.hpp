// Summary statistics of measured values, one implementation each: the study's seeds, the tokens
// per second of a training run (`ffnlab train`, ffnlab.train) and the benchmarks' rounds.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace ffnlab {

// The arithmetic mean; NaN for no values.
double mean(std::span<const double> values);
// The sample standard deviation (n − 1 in the denominator); 0 for fewer than two values.
double sample_std(std::span<const double> values);
// The population standard deviation (n in the denominator); 0 for no values.
double population_std(std::span<const double> values);
// The upper median (the middle value of an odd count, the upper of the two middle ones of an
// even count: always a value that was measured); NaN for no values.
double median(std::vector<double> values);
// The interquartile range over the median, (Q3 − Q1) / median, with the quartiles measured
// values (ranks n/4 and n − 1 − n/4 of the sorted values: for 7 values the 2nd and the 6th), so
// that one disturbed value on either side moves it little; 0 for fewer than two values.
double interquartile_spread(std::vector<double> values);

// The mean of n values and its two-sided confidence interval at `level` from Student's t with
// n − 1 degrees of freedom: mean ± t·s/√n (s the sample standard deviation). With fewer than two
// values there is no interval: low and high are NaN.
struct MeanInterval {
  double mean = 0, low = 0, high = 0;
  std::size_t n = 0;
  double level = 0;
  bool defined() const;  // n >= 2
};
MeanInterval mean_interval(std::span<const double> values, double level = 0.95);

// Paired comparison of a variant against a reference by its differences (variant − reference,
// one per seed; lower is better, as for bits per byte), with the two tests stated in advance:
// - better / worse: the 95 % interval of the mean difference excludes 0;
// - equivalent: otherwise, and the 90 % interval lies within ±margin
//   (two one-sided t tests at 5 %, TOST): the data show the difference is smaller than the
//   margin;
// - inconclusive: neither; the seeds cannot tell.
// ci95 and ci90 hold the two intervals (compare_sequential fills them with its wider ones).
enum class Comparison { better, worse, equivalent, inconclusive, one_value };
struct PairedComparison {
  MeanInterval ci95, ci90;
  double margin = 0;
  Comparison verdict = Comparison::one_value;
};
PairedComparison compare_paired(std::span<const double> differences, double margin);

// ---- Sequential comparisons ----
//
// A comparison that trains paired seeds in rounds and looks after each one, stopping as soon as
// it is decided or at a cap fixed before the run. Looking more than once would make a fixed
// 95 % interval wrong more often than 5 % of the time; a group-sequential design keeps the
// error at its level over all the looks: it spends the error α over the looks, little at the
// early ones and most at the last, by the O'Brien–Fleming-type function of Lan & DeMets (1983),
// α(t) = 2 − 2Φ(z_{1−α/2} / √t) at information fraction t = seeds / cap. Each look's interval is
// the repeated confidence interval (Jennison & Turnbull 2000, ch. 9): mean ± c_n · s/√n, whose
// bounds c_n are set so that, with no difference, the chance that |t| first reaches c_n at look
// n is α(n/cap) − α((n−1)/cap). All of them then cover the true difference together with
// probability 1 − α whatever the stopping rule, so "better", "worse" and "equivalent" read from
// them hold their error rates. With 2 to 7 seeds the t statistic is far from normal, so the
// bounds c_n are those of the t statistics themselves, found by simulating studies with no
// difference (sequential_t_bounds); the normal ones (obrien_fleming_bounds, by numerical
// integration) are their limit with many seeds.
struct SequentialDesign {
  int first = 3;        // seeds at the first look
  int cap = 6;          // the most seeds a comparison trains; looks at first, first + 1, …, cap
  double alpha = 0.05;  // two-sided error of better/worse; equivalence spends 2α (TOST at α)
};
// The design's seeds in words: "3 to 6 seeds", or "1 seed" where first = cap = 1.
std::string seeds_text(const SequentialDesign& design);

// The two-sided z boundaries of a group-sequential test that looks at increasing information
// fractions (the last 1) and spends `alpha` by the O'Brien–Fleming-type function above: with no
// difference, the chance that |Z_k| ≥ bound_k at look k and at no look before is
// α(t_k) − α(t_{k−1}). Computed by numerical integration (Armitage, McPherson & Rowe 1969).
std::vector<double> obrien_fleming_bounds(std::span<const double> fractions, double alpha);

// The bounds on |t| (t = mean / (s/√n) of n paired values) at the design's looks n = first …
// cap, spending `alpha` as above: from `paths` simulated studies with no difference (a
// generator of fixed seed, so that every machine gets the same bounds up to the last bits of
// its libm). The chance each look spends is met to within about √(spent/paths). Throws Error
// unless 2 <= first <= cap and 0 < alpha < 1.
std::vector<double> sequential_t_bounds(const SequentialDesign& design, double alpha,
                                        int paths = 400000);
// The bound at look n (first ≤ n ≤ cap), computed once per design and alpha.
double sequential_bound(const SequentialDesign& design, int n, double alpha);

// The comparison after n = differences.size() seeds: compare_paired's two tests on the
// repeated confidence intervals of the look (bounds at α for better/worse, at 2α for
// equivalence; each interval's `level` is the nominal two-sided level of its bound alone). n
// below design.first gives the plain fixed-sample comparison (a look the design does not make);
// n above design.cap throws Error.
PairedComparison compare_sequential(std::span<const double> differences, double margin,
                                    const SequentialDesign& design);

// An upper confidence bound on the standard deviation behind the sample `values` (one-sided,
// at `level`, from the chi-square distribution of the sample variance): the spread to plan
// seeds from, since the spread seen on a few seeds is as often too small as too large. 0 for
// fewer than two values.
double spread_upper_bound(std::span<const double> values, double level = 0.90);

// Whether the spread of `values` is implausibly small for a spread of `expected` (a standard
// deviation seen elsewhere): the chance of a sample standard deviation this small or smaller is
// under `chance` (chi-square with n − 1 degrees of freedom). Such an interval is narrow by
// chance, not by precision.
bool narrow_by_chance(std::span<const double> values, double expected, double chance = 0.05);

// How many paired values would decide an undecided comparison if its mean stayed as seen and
// its spread were the upper bound above (spread_upper_bound): the smallest n for which the 95 %
// interval would exclude 0, or the 90 % interval lie within ±margin (compare_paired's two
// tests). A planning figure, not a promise. 0 when there is nothing to plan from (fewer than
// two values, or no spread); limit + 1 when it is beyond `limit`.
int values_to_decide(std::span<const double> differences, double margin, int limit = 1000);
// The same under a sequential design: the smallest n from the current count to design.cap at
// whose look the comparison would decide; design.cap + 1 when it would not by the cap.
int values_to_decide(std::span<const double> differences, double margin,
                     const SequentialDesign& design);

// How a difference changes along x, from groups of values each taken at one x (e.g. the paired
// differences to ReLU of each model size, against log10 of its training compute): the slope
// of the least-squares line through the groups' means, and its two-sided interval at `level`.
// The groups may differ in spread and size, so the slope's variance is Σ c_k² s_k² / n_k
// (c_k the line's weight of group k's mean, s_k its sample standard deviation) with
// Welch–Satterthwaite degrees of freedom; for two groups this is Welch's two-sample interval
// of the difference of the means, over the distance of their x. No interval (low and high NaN)
// with fewer than two groups, a group of fewer than two values, two groups at one x, or no
// spread at all.
struct SlopeInterval {
  double slope = 0, low = 0, high = 0;
  double degrees_of_freedom = 0;
  double level = 0;
  bool defined() const;
};
SlopeInterval slope_interval(std::span<const double> x,
                             const std::vector<std::vector<double>>& groups, double level = 0.95);

}  // namespace ffnlab
