// Summary statistics of measured values, one implementation each: the study's seeds, the tokens
// per second of a training run (`ffnlab train`, ffnlab.train) and the benchmarks' rounds.
#pragma once

#include <span>
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
// - equivalent: otherwise, and the 90 % interval lies within ±margin (two one-sided t tests at
//   5 %, TOST): the data show the difference is smaller than the margin;
// - inconclusive: neither; the seeds cannot tell.
enum class Comparison { better, worse, equivalent, inconclusive, one_value };
struct PairedComparison {
  MeanInterval ci95, ci90;
  double margin = 0;
  Comparison verdict = Comparison::one_value;
};
PairedComparison compare_paired(std::span<const double> differences, double margin);

// How many paired values would decide an undecided comparison if their mean and standard
// deviation stayed as these show them: the smallest n for which the 95 % interval would exclude
// 0, or the 90 % interval lie within ±margin (compare_paired's two tests). A planning figure,
// not a promise: the next seeds move the mean and the spread. 0 when there is nothing to plan
// from (fewer than two values, or no spread); limit + 1 when it is beyond `limit`.
int values_to_decide(std::span<const double> differences, double margin, int limit = 1000);

}  // namespace ffnlab
