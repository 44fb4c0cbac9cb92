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

}  // namespace ffnlab
