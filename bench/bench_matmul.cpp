// Fixed-shape against run-time-dimension oneDNN products (MatmulOptions::dynamic_m/dynamic_k),
// the choice behind the MoE's per-expert products: the first call with a new M pays the
// primitive's creation when the shape is fixed; a run-time M is created once. The steady rates
// of the two are timed in alternating rounds, so that drift of a shared machine hits both alike.
//
//   bench_matmul [--k 512] [--n 2048] [--m 800,1600,1601,3200] [--rounds 3] [--seconds 0.2]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_cli.hpp"
#include "bench_util.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/ops/matmul.hpp"

using namespace ffnlab;

namespace {

// Seconds of one call (the first: creation included).
double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run(std::int64_t K, std::int64_t N, const std::vector<std::int64_t>& ms, int rounds,
         double budget);

}  // namespace

int main(int argc, char** argv) {
  std::int64_t K = 512, N = 2048;
  std::vector<std::int64_t> ms{800, 1600, 1601, 3200};
  int rounds = 3;
  double budget = 0.2;
  CLI::App app{
      "oneDNN products with a fixed shape against a run-time dimension: first call "
      "(primitive creation) and steady rate, the two timed in alternating rounds.\n"
      "Exit status: 0 done, 1 refused (more memory than there is), 2 a bad flag, 3 out of "
      "memory or a failed write."};
  bench::width_option(app, "--k", K, "inner dimension K");
  bench::width_option(app, "--n", N, "output columns N");
  bench::tokens_option(app, "--m", ms, "row counts M, comma-separated");
  bench::rounds_option(app, rounds, "alternating rounds of the steady rates");
  bench::add_seconds_option(app, budget);
  app.callback([&] { run(K, N, ms, rounds, budget); });
  return cli::run_program("bench_matmul", app, argc, argv);
}

namespace {

void run(std::int64_t K, std::int64_t N, const std::vector<std::int64_t>& ms, int rounds,
         double budget) {
  std::int64_t max_m = 0;
  for (auto m : ms) max_m = std::max(max_m, m);
  // Before anything is allocated: w, dw [N, K], x [M, K], da and y [M, N].
  bench::Footprint need;
  need.add_n(2, {N, K});
  need.add({max_m, K + 2 * N});
  need.check("bench_matmul", "the largest product");
  const Tensor w = bench::random({N, K}, 1), x = bench::random({max_m, K}, 2);
  const Tensor da = bench::random({max_m, N}, 3);
  Tensor y({max_m, N}), dw({N, K});

  fmt::print("{}\n", bench::measured_on("bench_matmul"));
  fmt::print(
      "oneDNN products through ffnlab::matmul, K {}, N {}: first call (primitive creation "
      "included) and steady GFLOP/s (median of {} alternating rounds, {} s each), fixed shape "
      "against a run-time dimension; 'dyn/fixed' is the run-time dimension's steady rate over "
      "the fixed shape's, 'rounds' each round's, lowest to highest.\n\n",
      K, N, rounds, budget);
  fmt::print("{:<34} {:>6} {:>12} {:>10} {:>12} {:>10} {:>10} {:>11}\n", "product", "M|K",
             "fixed first", "fixed", "dynamic 1st", "dynamic", "dyn/fixed", "rounds");
  for (int pass = 0; pass < 2; ++pass) {
    const bool grad = pass == 1;
    for (auto m : ms) {
      std::function<void()> product[2];
      for (int dynamic = 0; dynamic < 2; ++dynamic) {
        MatmulOptions o;
        if (grad) {
          o.accumulate = true;
          o.dynamic_k = dynamic;
        } else {
          o.dynamic_m = dynamic;
        }
        product[dynamic] = [&, o, m] {
          if (grad) {
            matmul(dw, da.rows(0, m), Trans::yes, x.rows(0, m), Trans::no, o);
          } else {
            Tensor out = y.rows(0, m);
            matmul(out, x.rows(0, m), Trans::no, w, Trans::yes, o);
          }
        };
      }
      const double first[2] = {seconds_of(product[0]), seconds_of(product[1])};
      std::vector<double> steady[2], ratio;
      for (int round = 0; round < rounds; ++round) {
        for (int dynamic = 0; dynamic < 2; ++dynamic)
          steady[dynamic].push_back(bench::time_it(product[dynamic], budget));
        ratio.push_back(steady[0].back() / steady[1].back());
      }
      const double fixed = median(steady[0]), dynamic = median(steady[1]);
      const auto [low, high] = std::minmax_element(ratio.begin(), ratio.end());
      const double flops = 2.0 * static_cast<double>(m) * K * N;
      fmt::print("{:<34} {:>6} {:>10.2f}ms {:>10.0f} {:>10.2f}ms {:>10.0f} {:>9.3f}x {:>11}\n",
                 grad ? "dW[N,K] += dA^T[N,M] . X[M,K]" : "Y[M,N] = X[M,K] . W^T", m,
                 first[0] * 1e3, flops / fixed / 1e9, first[1] * 1e3, flops / dynamic / 1e9,
                 fixed / dynamic, fmt::format("{:.2f}-{:.2f}", *low, *high));
      std::fflush(stdout);
    }
  }
}

}  // namespace
