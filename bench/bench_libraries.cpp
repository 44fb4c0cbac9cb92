// oneDNN's f32 products against other BLAS libraries, in one process, in alternating rounds: the
// measurement behind the product-library row of ops/dispatch.hpp (which library ffnlab's products
// use).
//
// For each token count T it times the three products of each of a layer's two weights, as
// training runs them: forward y = x·wᵀ, input gradient dx = dy·w, weight gradient dw += dyᵀ·x
// (oneDNN plain, as matmul() runs them). Every other library is any shared library with a CBLAS
// cblas_sgemm with 32-bit integer arguments (Debian's OpenBLAS, BLIS; not the 64-bit-integer
// libopenblas64), opened at run time, so ffnlab links none of them. Each
// round times every library once per product, in turn; a product's rate is the median over
// rounds of each round's median call. One more column, "1x1 conv", runs the forward and
// input-gradient products as oneDNN's 1x1 convolution (ops/matmul.hpp, matmul_conv_min_rows):
// the measurement behind dispatch::kConvMinRows; "oneDNN" is its matmul. The summary gives each
// library's rate over oneDNN's,
// geometric means per kind of product, and whether any beats oneDNN by more than the margin
// that decides (5 %, beyond the round-to-round drift of a shared machine).
//
//   bench_libraries [--library /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0]
//                   [--d-model 512] [--d-ff 2048] [--tokens 1600,2048,6400] [--rounds 4]
#include <dlfcn.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "bench_cli.hpp"
#include "bench_util.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/ops/matmul.hpp"

using namespace ffnlab;

namespace {

// CBLAS's row-major and transpose codes, and its sgemm (cblas.h; not included, so that no
// library's headers are needed).
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                       float, float*, int);

struct Library {
  std::string path;
  std::string name;  // the file name, shown in the table
  Sgemm sgemm = nullptr;
  // Instead of a library: oneDNN's 1x1 convolution, as matmul() runs it from
  // matmul_conv_min_rows() rows (forward and input-gradient products only).
  bool conv = false;
};

// Opens a library and finds its cblas_sgemm; tells it the thread count where it has a call for
// that (BLIS reads BLIS_NUM_THREADS/OMP_NUM_THREADS once, and runs one thread when neither is
// set; OpenBLAS's OpenMP build follows omp_get_max_threads by itself).
Library open_library(const std::string& path, int threads) {
  // dlopen("") would open this program itself.
  if (path.empty()) throw Error("[bench_libraries] --library: an empty path");
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw Error(fmt::format("[bench_libraries] cannot open {}: {}", path, dlerror()));
  Library lib{path, std::filesystem::path(path).filename().string(),
              reinterpret_cast<Sgemm>(dlsym(handle, "cblas_sgemm"))};
  if (!lib.sgemm) throw Error(fmt::format("[bench_libraries] {} has no cblas_sgemm", path));
  using SetThreads = void (*)(int);
  for (const char* setter : {"bli_thread_set_num_threads", "openblas_set_num_threads"})
    if (auto set = reinterpret_cast<SetThreads>(dlsym(handle, setter))) set(threads);
  return lib;
}

// Debian's OpenMP builds of OpenBLAS and BLIS, where installed.
std::vector<std::string> default_libraries() {
  std::vector<std::string> out;
  for (const char* p : {"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
                        "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4"})
    if (std::filesystem::exists(p)) out.push_back(p);
  return out;
}

enum class Kind { forward, input_gradient, weight_gradient };
constexpr const char* kKindNames[] = {"forward", "input grad", "weight grad"};

struct Product {
  std::string weight;  // "in" (D -> F) or "out" (F -> D)
  Kind kind;
  std::int64_t M, N, K;
  bool ta, tb, accumulate;
};

// The three products of a weight w [O, I] at T rows.
void add_products(std::vector<Product>& out, const std::string& weight, std::int64_t T,
                  std::int64_t I, std::int64_t O) {
  out.push_back({weight, Kind::forward, T, O, I, false, true, false});
  out.push_back({weight, Kind::input_gradient, T, I, O, false, false, false});
  out.push_back({weight, Kind::weight_gradient, O, I, T, true, false, true});
}

void run(std::int64_t D, std::int64_t F, const std::vector<std::int64_t>& tokens, int rounds,
         double budget, const std::vector<std::string>& paths) {
  std::int64_t max_t = 0;
  for (auto t : tokens) max_t = std::max(max_t, t);
  bench::Footprint need;  // the largest product's a, b and c
  need.add({max_t, 2 * std::max(D, F) + D + F});
  need.add_n(2, {F, D});
  need.check("bench_libraries", "the largest product");
  // CBLAS takes 32-bit ints (an LP64 build: Debian's libopenblas0 and libblis4, not
  // libopenblas64): a dimension past INT_MAX would reach it negative.
  if (max_t > std::numeric_limits<int>::max() || D > std::numeric_limits<int>::max() / 2 ||
      F > std::numeric_limits<int>::max() / 2)
    throw Error(fmt::format(
        "[bench_libraries] --tokens {}: CBLAS takes dimensions of at most {} (32-bit ints)", max_t,
        std::numeric_limits<int>::max()));
  const int threads = omp_get_max_threads();
  std::vector<Library> libs{{"", "1x1 conv", nullptr, true}};
  for (const auto& p : paths) libs.push_back(open_library(p, threads));
  const std::int64_t conv_rows = matmul_conv_min_rows();

  std::vector<Product> products;
  for (auto T : tokens) {
    add_products(products, "in", T, D, F);
    add_products(products, "out", T, F, D);
  }
  std::string others;
  for (std::size_t l = 1; l < libs.size(); ++l)
    others += (l == 1 ? "" : l + 1 == libs.size() ? " and " : ", ") + libs[l].name;
  fmt::print("{}\n", bench::measured_on("bench_libraries"));
  fmt::print(
      "f32 products, d_model {}, d_ff {}: oneDNN's matmul against its 1x1 "
      "convolution (ffnlab's path from {} rows for forward and input-gradient products{}) and "
      "{}, {} alternating rounds; GFLOP/s is the median over rounds of each round's median call, "
      "'x' a column's rate over oneDNN's matmul.\n\n",
      D, F, conv_rows, conv_rows == 0 ? ": never here" : "",
      others.empty() ? std::string("no other library") : others, rounds);
  std::string head = fmt::format("{:<6} {:<12} {:>6} {:>6} {:>6} | {:>8}", "weight", "product", "M",
                                 "N", "K", "oneDNN");
  for (const auto& l : libs) head += fmt::format(" | {:>16.16} {:>5}", l.name, "x");
  fmt::print("{}\n", head);

  // log(rate / oneDNN's) per library and kind, for the geometric means.
  std::vector<std::vector<std::vector<double>>> logs(libs.size(),
                                                     std::vector<std::vector<double>>(3));
  // log(rate / oneDNN's as ffnlab runs the product), for the product-library verdict.
  auto logs_as_run = logs;
  for (const auto& p : products) {
    const Tensor a = bench::random(p.ta ? Shape{p.K, p.M} : Shape{p.M, p.K}, 1);
    const Tensor b = bench::random(p.tb ? Shape{p.N, p.K} : Shape{p.K, p.N}, 2);
    Tensor c({p.M, p.N});
    c.zero();
    MatmulOptions opt;
    opt.accumulate = p.accumulate;
    const int n = 1 + static_cast<int>(libs.size());
    // The convolution serves products whose a is read as stored (not the weight gradient).
    const bool conv_serves = !p.ta;
    std::int64_t conv_calls = 0;
    auto call = [&](int who) {
      if (who == 0 || libs[who - 1].conv) {
        if (who > 0 && !conv_serves) return;
        set_matmul_conv_min_rows(who == 0 ? 0 : 1);
        const auto before = matmul_conv_products();
        matmul(c, a, p.ta ? Trans::yes : Trans::no, b, p.tb ? Trans::yes : Trans::no, opt);
        conv_calls += matmul_conv_products() - before;
        set_matmul_conv_min_rows(conv_rows);
        return;
      }
      libs[who - 1].sgemm(kRowMajor, p.ta ? kTrans : kNoTrans, p.tb ? kTrans : kNoTrans,
                          static_cast<int>(p.M), static_cast<int>(p.N), static_cast<int>(p.K), 1.f,
                          a.f32(), static_cast<int>(p.ta ? p.M : p.K), b.f32(),
                          static_cast<int>(p.tb ? p.K : p.N), p.accumulate ? 1.f : 0.f, c.f32(),
                          static_cast<int>(p.N));
    };
    std::vector<std::vector<double>> seconds(n);
    for (int r = 0; r < rounds; ++r)
      for (int who = 0; who < n; ++who)
        seconds[who].push_back(bench::time_it([&] { call(who); }, budget));
    const double flops = 2.0 * static_cast<double>(p.M) * p.N * p.K;
    const double onednn = flops / median(seconds[0]) / 1e9;
    std::string line = fmt::format("{:<6} {:<12} {:>6} {:>6} {:>6} | {:>8.1f}", p.weight,
                                   kKindNames[static_cast<int>(p.kind)], p.M, p.N, p.K, onednn);
    // oneDNN as ffnlab runs this product: the convolution's rate where matmul() takes it.
    const bool conv_ran = conv_serves && conv_calls > 0;
    const double as_run =
        conv_ran && conv_rows > 0 && p.M >= conv_rows ? flops / median(seconds[1]) / 1e9 : onednn;
    for (std::size_t l = 0; l < libs.size(); ++l) {
      // A convolution that did not run (this product, or oneDNN choosing a 1x1 kernel other than
      // its AVX2 one for the shape: the matmul served it) has no column.
      if (libs[l].conv && !conv_ran) {
        line += fmt::format(" | {:>16} {:>5}", "-", "");
        continue;
      }
      const double rate = flops / median(seconds[l + 1]) / 1e9;
      logs[l][static_cast<int>(p.kind)].push_back(std::log(rate / onednn));
      if (!libs[l].conv)
        logs_as_run[l][static_cast<int>(p.kind)].push_back(std::log(rate / as_run));
      line += fmt::format(" | {:>16.1f} {:>4.2f}x", rate, rate / onednn);
    }
    fmt::print("{}\n", line);
    std::fflush(stdout);
  }

  constexpr double kMargin = 1.05;
  fmt::print("\nEach column's rate over oneDNN's matmul, geometric mean of the products above:\n");
  // The geometric mean of rates given as logs.
  const auto geomean = [](const std::vector<double>& logs_of) {
    double sum = 0;
    for (double v : logs_of) sum += v;
    return std::exp(sum / static_cast<double>(logs_of.size()));
  };
  for (std::size_t l = 0; l < libs.size(); ++l) {
    std::string line = fmt::format("  {:<20}", libs[l].name);
    std::vector<double> all;
    std::vector<std::string> wins;
    for (int k = 0; k < 3; ++k) {
      if (logs[l][k].empty()) continue;
      const double g = geomean(logs[l][k]);
      all.insert(all.end(), logs[l][k].begin(), logs[l][k].end());
      line += fmt::format(" {} {:.3f}x,", kKindNames[k], g);
      if (g > kMargin) wins.push_back(kKindNames[k]);
    }
    if (!all.empty()) line += fmt::format(" all {:.3f}x", geomean(all));
    fmt::print("{}\n", line);
    if (libs[l].conv) {
      if (all.empty())
        fmt::print(
            "  -> the convolution did not run: ffnlab runs only oneDNN's AVX2 1x1 kernel as a "
            "product, and oneDNN chose another for these products on this CPU (its AVX-512 one "
            "where the CPU has AVX-512)\n");
      else if (wins.empty())
        fmt::print(
            "  -> the convolution beats the matmul on no kind of product by more than {:.0f} %\n",
            (kMargin - 1) * 100);
      for (const auto& w : wins)
        fmt::print("  -> the convolution beats the matmul on {} products by more than {:.0f} %\n",
                   w, (kMargin - 1) * 100);
      continue;
    }
    // A library replaces oneDNN only where it beats oneDNN as ffnlab runs the product (the
    // convolution, where it serves).
    std::string against = "  against oneDNN as ffnlab runs it:";
    std::vector<std::string> beats;
    for (int k = 0; k < 3; ++k) {
      const double g = geomean(logs_as_run[l][k]);
      against += fmt::format(" {} {:.3f}x{}", kKindNames[k], g, k < 2 ? "," : "");
      if (g > kMargin) beats.push_back(kKindNames[k]);
    }
    fmt::print("{}\n", against);
    if (beats.empty())
      fmt::print("  -> no kind of product beats oneDNN by more than {:.0f} %: oneDNN stays\n",
                 (kMargin - 1) * 100);
    else
      for (const auto& w : beats)
        fmt::print("  -> {} beats oneDNN on {} products by more than {:.0f} %\n", libs[l].name, w,
                   (kMargin - 1) * 100);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t D = 512, F = 2048;
  std::vector<std::int64_t> tokens{1600, 2048, 6400};
  int rounds = 4;
  double budget = 0.5;
  std::vector<std::string> libraries = default_libraries();
  CLI::App app{
      "oneDNN's f32 products against other BLAS libraries (any shared library with CBLAS's "
      "cblas_sgemm, opened at run time), in one process, in alternating rounds: a layer's "
      "forward, input-gradient and weight-gradient products at each token count. The measurement "
      "behind the product-library and kConvMinRows rows of include/ffnlab/ops/dispatch.hpp (a "
      "'1x1 conv' column: oneDNN's 1x1 convolution against its matmul).\n"
      "Exit status: 0 done, 1 refused (a library that does not open, more memory than there is), "
      "2 a bad flag, 3 out of memory or a failed write."};
  app.add_option("--library", libraries,
                 "shared libraries with cblas_sgemm to compare, comma-separated (default: "
                 "Debian's OpenMP builds of OpenBLAS and BLIS, where installed)")
      ->delimiter(',');
  bench::width_option(app, "--d-model", D, "model width D");
  bench::width_option(app, "--d-ff", F, "hidden width F");
  bench::tokens_option(app, "--tokens", tokens,
                       "token counts, comma-separated (1600: an MoE expert's block at 6400 tokens, "
                       "8 experts, top-2; 2048: a training step of the large model)");
  bench::rounds_option(app, rounds, "alternating rounds");
  bench::add_seconds_option(app, budget);
  app.callback([&] { run(D, F, tokens, rounds, budget, libraries); });
  return cli::run_program("bench_libraries", app, argc, argv);
}
