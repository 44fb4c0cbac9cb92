// oneDNN's own packed weight layout (format_tag::any + one reorder) against the plain [N, K]
// layout that ffnlab's products read, for the products of an FFN layer: the measurement behind
// the choice not to pack weights for training (docs/benchmarks.md). Both in the same run.
//
//   bench_packed [--d-model 512] [--d-ff 2048] [--tokens 8,512,6400] [--seconds 0.5]
#include <fmt/format.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "bench_cli.hpp"
#include "bench_util.hpp"

using namespace ffnlab;
using dnnl::memory;

namespace {

struct Result {
  double plain_s, packed_s, reorder_s;
};

// C [M, N] = A [M, K] · B, with B stored [N, K] (read transposed, as y = x·Wᵀ) or [K, N].
Result compare(std::int64_t M, std::int64_t K, std::int64_t N, bool b_transposed, double budget) {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  static dnnl::stream strm(eng);
  const Tensor a = bench::random({M, K}, 1), b = bench::random({N, K}, 2);
  Tensor c({M, N});
  const memory::desc a_md({M, K}, memory::data_type::f32, memory::dims{K, 1});
  const memory::desc b_md({K, N}, memory::data_type::f32,
                          b_transposed ? memory::dims{1, K} : memory::dims{N, 1});
  const memory::desc c_md({M, N}, memory::data_type::f32, memory::dims{N, 1});
  memory am(a_md, eng, const_cast<float*>(a.f32())), bm(b_md, eng, const_cast<float*>(b.f32())),
      cm(c_md, eng, c.f32());
  dnnl::matmul plain(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng));
  const memory::desc any({K, N}, memory::data_type::f32, memory::format_tag::any);
  const auto packed_pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, any, c_md), eng);
  dnnl::matmul packed(packed_pd);
  memory bp(packed_pd.weights_desc(), eng);
  Result r;
  r.reorder_s = bench::time_it(
      [&] {
        dnnl::reorder(bm, bp).execute(strm, bm, bp);
        strm.wait();
      },
      budget);
  r.plain_s = bench::time_it(
      [&] {
        plain.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        strm.wait();
      },
      budget);
  r.packed_s = bench::time_it(
      [&] {
        packed.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bp}, {DNNL_ARG_DST, cm}});
        strm.wait();
      },
      budget);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t D = 512, F = 2048;
  std::vector<std::int64_t> tokens{8, 512, 6400};
  double budget = 0.5;
  CLI::App app{"oneDNN's packed weight layout against the plain one, for an FFN's products."};
  bench::positive_option(app, "--d-model", D, "model width D");
  bench::positive_option(app, "--d-ff", F, "hidden width F");
  bench::positive_option(app, "--tokens", tokens, "token counts, comma-separated")->delimiter(',');
  bench::add_seconds_option(app, budget);
  CLI11_PARSE(app, argc, argv);

  fmt::print("{:<28} {:>6} {:>12} {:>12} {:>8} {:>14}\n", "product", "T", "plain GF/s",
             "packed GF/s", "packed/", "reorder/prod");
  for (std::int64_t T : tokens) {
    struct Case {
      const char* name;
      std::int64_t K, N;
      bool transposed;
    };
    const Case cases[] = {{"up:   x[T,D] . W_in^T", D, F, true},
                          {"down: h[T,F] . W_out^T", F, D, true},
                          {"dx:   da[T,F] . W_in", F, D, false}};
    for (const Case& c : cases) {
      const Result r = compare(T, c.K, c.N, c.transposed, budget);
      const double flops = 2.0 * static_cast<double>(T) * c.K * c.N;
      fmt::print("{:<28} {:>6} {:>12.1f} {:>12.1f} {:>7.3f}x {:>13.1f}%\n", c.name, T,
                 flops / r.plain_s / 1e9, flops / r.packed_s / 1e9, r.plain_s / r.packed_s,
                 100 * r.reorder_s / r.packed_s);
    }
  }
  return 0;
}
