// oneDNN's own packed weight layout (format_tag::any + one reorder) against the plain [N, K]
// layout, for the products of an FFN layer, in f32 or bf16, both in the same run: the
// measurement behind the choice not to pack the weights of training products
// (docs/benchmarks.md). In bf16 the reorder also converts the f32 weights, which a plain bf16
// product converts on every call: "convert/prod" is that conversion's share. The dW product
// (dyᵀ·x) has no weight operand, so nothing to pack: its rate is printed for comparison.
//
// The plain and packed products (and the reorder and conversion) are timed in alternating rounds,
// so that drift of a shared machine hits both alike: medians over rounds, and the range of each
// round's packed/plain ratio.
//
//   bench_packed [--d-model 512] [--d-ff 2048] [--tokens 8,512,6400] [--dtype f32]
//                [--rounds 3] [--seconds 0.2]
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "bench_cli.hpp"
#include "bench_util.hpp"
#include "ffnlab/analysis/stats.hpp"

using namespace ffnlab;
using dnnl::memory;

namespace {

// Medians over rounds, seconds; `speed_up` each round's plain over packed time.
struct Result {
  double plain_s = 0, packed_s = 0, reorder_s = 0, convert_s = 0;
  std::vector<double> speed_up;
};

// C [M, N] = A [M, K] · B, with B stored [N, K] (read transposed, as y = x·Wᵀ) or [K, N]. A is
// stored [M, K], or [K, M] read transposed (dW = dyᵀ·x, whose B is not a weight: then only the
// plain product is timed).
Result compare(std::int64_t M, std::int64_t K, std::int64_t N, bool a_transposed, bool b_transposed,
               bool bf16, int rounds, double budget) {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  static dnnl::stream strm(eng);
  const auto dt = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const Tensor a = bench::random({M, K}, 1), b = bench::random({N, K}, 2);
  Tensor c({M, N});
  const Tensor a_op = bf16 ? a.to(DType::bf16) : a, b_op = bf16 ? b.to(DType::bf16) : b;
  void* a_ptr = const_cast<void*>(a_op.raw());
  void* b_ptr = const_cast<void*>(b_op.raw());
  const memory::desc a_md({M, K}, dt, a_transposed ? memory::dims{1, M} : memory::dims{K, 1});
  const memory::dims b_strides = b_transposed ? memory::dims{1, K} : memory::dims{N, 1};
  const memory::desc b_md({K, N}, dt, b_strides);
  const memory::desc b_f32({K, N}, memory::data_type::f32, b_strides);
  const memory::desc c_md({M, N}, memory::data_type::f32, memory::dims{N, 1});
  memory am(a_md, eng, a_ptr), bm(b_md, eng, b_ptr), bm32(b_f32, eng, const_cast<float*>(b.f32())),
      cm(c_md, eng, c.f32());
  dnnl::matmul plain(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng));
  auto run_plain = [&] {
    plain.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    strm.wait();
  };
  Result r;
  std::vector<double> plain_s, packed_s, reorder_s, convert_s;
  if (a_transposed) {  // no weight operand: the plain product alone
    for (int round = 0; round < rounds; ++round)
      plain_s.push_back(bench::time_it(run_plain, budget));
    r.plain_s = median(plain_s);
    return r;
  }
  const memory::desc any({K, N}, dt, memory::format_tag::any);
  const auto packed_pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, any, c_md), eng);
  dnnl::matmul packed(packed_pd);
  memory bp(packed_pd.weights_desc(), eng);
  auto reorder = [&] {  // from the f32 master weights, as a training step would
    dnnl::reorder(bm32, bp).execute(strm, bm32, bp);
    strm.wait();
  };
  auto run_packed = [&] {
    packed.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bp}, {DNNL_ARG_DST, cm}});
    strm.wait();
  };
  Tensor converted;  // what a plain bf16 product of f32 weights adds on every call (as ops/matmul)
  auto convert = [&] { converted.assign_converted(b, DType::bf16); };
  for (int round = 0; round < rounds; ++round) {
    plain_s.push_back(bench::time_it(run_plain, budget));
    if (bf16) convert_s.push_back(bench::time_it(convert, budget));
    reorder_s.push_back(bench::time_it(reorder, budget));
    packed_s.push_back(bench::time_it(run_packed, budget));
    r.speed_up.push_back(plain_s.back() / packed_s.back());
  }
  r.plain_s = median(plain_s), r.packed_s = median(packed_s), r.reorder_s = median(reorder_s);
  if (bf16) r.convert_s = median(convert_s);
  return r;
}

struct Case {
  const char* name;
  std::int64_t M, K, N;
  bool a_transposed, b_transposed;
};

// The products of an FFN layer at T tokens.
std::vector<Case> cases(std::int64_t D, std::int64_t F, std::int64_t T) {
  return {{"up:   x[T,D] . W_in^T", T, D, F, false, true},
          {"down: h[T,F] . W_out^T", T, F, D, false, true},
          {"dx:   da[T,F] . W_in", T, F, D, false, false},
          {"dW:   da^T . x  (no weight)", F, T, D, true, false}};
}

void run(std::int64_t D, std::int64_t F, const std::vector<std::int64_t>& tokens, bool bf16,
         const std::string& dtype, int rounds, double budget);

}  // namespace

int main(int argc, char** argv) {
  std::int64_t D = 512, F = 2048;
  std::vector<std::int64_t> tokens{8, 512, 6400};
  std::string dtype = "f32";
  int rounds = 3;
  double budget = 0.2;
  CLI::App app{
      "oneDNN's packed weight layout against the plain one, for an FFN's products, in "
      "alternating rounds (plain, conversion, reorder, packed): medians over rounds, and the "
      "range of each round's speed-up.\n"
      "Exit status: 0 done, 1 refused (more memory than there is, or bf16 on a CPU without "
      "it), 2 a bad flag, 3 out of memory or a failed write."};
  bench::width_option(app, "--d-model", D, "model width D");
  bench::width_option(app, "--d-ff", F, "hidden width F");
  bench::tokens_option(app, "--tokens", tokens, "token counts, comma-separated");
  app.add_option("--dtype", dtype, "product precision (bf16: bf16 products, f32 weights)")
      ->check(bench::one_of({"f32", "bf16"}))
      ->capture_default_str();
  bench::rounds_option(app, rounds, "alternating rounds");
  bench::add_seconds_option(app, budget);
  app.callback([&] {
    const bool bf16 = dtype == "bf16";
    if (bf16 && !matmul_bf16_native())
      throw Error(
          "[bench_packed] --dtype bf16: this CPU has no native bf16 products (oneDNN needs "
          "AVX-512 with bf16, or AMX)");
    // Before anything is allocated: the largest product's operands (one at a time), A, B and C
    // in f32, the packed B, and in bf16 the converted A and B.
    double largest = 0;
    for (std::int64_t T : tokens)
      for (const Case& c : cases(D, F, T)) {
        bench::Footprint f;
        f.add({c.M, c.K});
        f.add_n(2, {c.N, c.K});
        f.add({c.M, c.N});
        if (bf16) f.add({c.M + c.N, c.K}, 2);
        largest = std::max(largest, f.bytes());
      }
    check_memory(largest, "bench_packed", "the largest product");
    run(D, F, tokens, bf16, dtype, rounds, budget);
  });
  return cli::run_program("bench_packed", app, argc, argv);
}

namespace {

void run(std::int64_t D, std::int64_t F, const std::vector<std::int64_t>& tokens, bool bf16,
         const std::string& dtype, int rounds, double budget) {
  fmt::print("{}\n", bench::measured_on("bench_packed"));
  fmt::print(
      "{} products, d_model {}, d_ff {}, {} alternating rounds ({} s each), medians; packed/ = "
      "plain time over packed time ('rounds': each round's, lowest to highest); reorder (f32 "
      "plain -> packed{}) and convert (f32 -> bf16) as a share of one packed product\n\n",
      dtype, D, F, rounds, budget, bf16 ? " bf16" : "");
  fmt::print("{:<28} {:>6} {:>12} {:>12} {:>8} {:>11} {:>13} {:>13}\n", "product", "T",
             "plain GF/s", "packed GF/s", "packed/", "rounds", "reorder/prod", "convert/prod");
  for (std::int64_t T : tokens) {
    for (const Case& c : cases(D, F, T)) {
      const Result r = compare(c.M, c.K, c.N, c.a_transposed, c.b_transposed, bf16, rounds, budget);
      const double flops = 2.0 * static_cast<double>(c.M) * c.K * c.N;
      if (c.a_transposed) {
        fmt::print("{:<28} {:>6} {:>12.1f} {:>12} {:>8} {:>11} {:>13} {:>13}\n", c.name, T,
                   flops / r.plain_s / 1e9, "-", "-", "-", "-", "-");
        continue;
      }
      const auto [low, high] = std::minmax_element(r.speed_up.begin(), r.speed_up.end());
      fmt::print("{:<28} {:>6} {:>12.1f} {:>12.1f} {:>7.3f}x {:>11} {:>12.1f}% {:>13}\n", c.name, T,
                 flops / r.plain_s / 1e9, flops / r.packed_s / 1e9, r.plain_s / r.packed_s,
                 fmt::format("{:.2f}-{:.2f}", *low, *high), 100 * r.reorder_s / r.packed_s,
                 bf16 ? fmt::format("{:.1f}%", 100 * r.convert_s / r.packed_s) : "-");
      std::fflush(stdout);
    }
  }
}

}  // namespace
