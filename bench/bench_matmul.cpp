// Fixed-shape against run-time-dimension oneDNN products (MatmulOptions::dynamic_m/dynamic_k),
// the choice behind the MoE's per-expert products: the first call with a new M pays the
// primitive's creation when the shape is fixed; a run-time M is created once.
//
//   bench_matmul [--k 512] [--n 2048] [--m 800,1600,1601,3200] [--seconds 0.5]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "bench_cli.hpp"
#include "bench_util.hpp"
#include "ffnlab/ops/matmul.hpp"

using namespace ffnlab;

namespace {

// Seconds of the first call (creation included), then the median of later calls.
std::pair<double, double> first_and_steady(const std::function<void()>& f, double budget) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {first, bench::time_it(f, budget)};
}

void run(std::int64_t K, std::int64_t N, const std::vector<std::int64_t>& ms, double budget);

}  // namespace

int main(int argc, char** argv) {
  std::int64_t K = 512, N = 2048;
  std::vector<std::int64_t> ms{800, 1600, 1601, 3200};
  double budget = 0.5;
  CLI::App app{
      "oneDNN products with a fixed shape against a run-time dimension: first call "
      "(primitive creation) and steady rate.\n"
      "Exit status: 0 done, 1 refused (more memory than there is), 2 a bad flag, 3 out of "
      "memory or a failed write."};
  bench::width_option(app, "--k", K, "inner dimension K");
  bench::width_option(app, "--n", N, "output columns N");
  bench::tokens_option(app, "--m", ms, "row counts M, comma-separated");
  bench::add_seconds_option(app, budget);
  app.callback([&] { run(K, N, ms, budget); });
  return cli::run_program("bench_matmul", app, argc, argv);
}

namespace {

void run(std::int64_t K, std::int64_t N, const std::vector<std::int64_t>& ms, double budget) {
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

  fmt::print(
      "oneDNN products through ffnlab::matmul, K {}, N {}: first call (primitive creation "
      "included) and steady GFLOP/s, fixed shape against a run-time dimension.\n\n",
      K, N);
  fmt::print("{:<34} {:>6} {:>12} {:>10} {:>12} {:>10}\n", "product", "M|K", "fixed first", "fixed",
             "dynamic 1st", "dynamic");
  for (int pass = 0; pass < 2; ++pass) {
    const bool grad = pass == 1;
    for (auto m : ms) {
      double first[2], steady[2];
      for (int dynamic = 0; dynamic < 2; ++dynamic) {
        MatmulOptions o;
        if (grad) {
          o.accumulate = true;
          o.dynamic_k = dynamic;
        } else {
          o.dynamic_m = dynamic;
        }
        auto f = [&] {
          if (grad) {
            matmul(dw, da.rows(0, m), Trans::yes, x.rows(0, m), Trans::no, o);
          } else {
            Tensor out = y.rows(0, m);
            matmul(out, x.rows(0, m), Trans::no, w, Trans::yes, o);
          }
        };
        std::tie(first[dynamic], steady[dynamic]) = first_and_steady(f, budget);
      }
      const double flops = 2.0 * static_cast<double>(m) * K * N;
      fmt::print("{:<34} {:>6} {:>10.2f}ms {:>10.0f} {:>10.2f}ms {:>10.0f}\n",
                 grad ? "dW[N,K] += dA^T[N,M] . X[M,K]" : "Y[M,N] = X[M,K] . W^T", m,
                 first[0] * 1e3, flops / steady[0] / 1e9, first[1] * 1e3, flops / steady[1] / 1e9);
    }
  }
}

}  // namespace
