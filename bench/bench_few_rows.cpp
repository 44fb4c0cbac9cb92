// Where the few-token kernels (ops/few_rows) stop paying: f32 products of T = 1..8 rows through
// few_rows_linear / few_rows_linear_backward against oneDNN's products of the same shapes (fixed
// shape, and a run-time M as the MoE's expert blocks use), in alternating rounds. The layers
// send every f32 product of up to few_rows_f32_max() rows to the kernels; this is the
// measurement behind that limit (docs/benchmarks.md). With --weights bf16, the inference
// forward on a bf16 copy of the weights (set_inference_weights): the kernels reading bf16 against
// oneDNN's bf16 products (linear_forward in bf16, fixed shape and run-time M) on the same copy,
// where the CPU has them natively: the measurement behind few_rows_bf16_max().
//
//   bench_few_rows [--shapes 512x2048,2048x512,4096x14336] [--tokens 1,2,...,8] [--rounds 3]
//                  [--weights f32|bf16]
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_cli.hpp"
#include "bench_util.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/ops/few_rows.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/matmul.hpp"

using namespace ffnlab;

namespace {

struct Shape2 {
  std::int64_t in = 0, out = 0;
};

// "512x2048" → {512, 2048}; in = out = 0 for anything else, or a side outside [1, 2^24].
Shape2 parse_shape(const std::string& s) {
  const auto x = s.find('x');
  if (x == std::string::npos) return {};
  auto side = [&](std::size_t from, std::size_t to) -> std::int64_t {
    std::int64_t v = 0;
    const char* end = s.data() + to;
    const auto [ptr, ec] = std::from_chars(s.data() + from, end, v);
    return ec == std::errc() && ptr == end && v >= 1 && v <= limits::kWidth ? v : 0;
  };
  const std::int64_t in = side(0, x), out = side(x + 1, s.size());
  if (in == 0 || out == 0) return {};
  return {in, out};
}

// --shapes' check: "'512y2048' is not IN x OUT (such as 512x2048), each in [1, 2^24]".
CLI::Validator shape_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (parse_shape(text).in != 0) return {};
        return "'" + text.substr(0, 40) + "' is not IN x OUT (such as 512x2048), each in [1, 2^24]";
      },
      "INxOUT, each in [1, 2^24]");
}

void run(const std::vector<std::string>& shape_text, const std::vector<std::int64_t>& tokens,
         int rounds, double budget);
void run_bf16(const std::vector<std::string>& shape_text, const std::vector<std::int64_t>& tokens,
              int rounds, double budget);

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> shape_text{"512x2048", "2048x512", "4096x14336"};
  std::vector<std::int64_t> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  int rounds = 3;
  double budget = 0.2;
  CLI::App app{
      "f32 products of a few rows: the streaming kernels (ops/few_rows) against oneDNN's "
      "products of the same shapes, forward (y = x·Wᵀ + b) and backward (dx, dW, db), in "
      "alternating rounds. Speed-ups above 1 mean the kernels are faster.\n"
      "Exit status: 0 done, 1 refused (more memory than there is), 2 a bad flag, 3 out of "
      "memory or a failed write."};
  app.add_option("--shapes", shape_text, "IN x OUT of the weight, comma-separated")
      ->delimiter(',')
      ->check(shape_validator())
      ->capture_default_str();
  bench::int_option(app, "--tokens", tokens, 1, kFewRowsMax, "row counts, comma-separated")
      ->delimiter(',');
  bench::rounds_option(app, rounds, "alternating rounds");
  bench::add_seconds_option(app, budget);
  std::string weights = "f32";
  app.add_option("--weights", weights,
                 "the weights' storage: f32 (training products and f32 inference, forward and "
                 "backward) or bf16 (the inference forward on a bf16 copy, against oneDNN's bf16 "
                 "products; needs native bf16)")
      ->check(bench::one_of({"f32", "bf16"}))
      ->capture_default_str();
  app.callback([&] {
    if (weights == "bf16" && !matmul_bf16_native())
      throw Error(
          "[bench_few_rows] --weights bf16: this CPU has no native bf16 products (oneDNN needs "
          "AVX-512 with bf16, or AMX)");
    // Before anything is allocated: the largest weight's tensors (one shape at a time), w and
    // dw [OUT, IN], and the rows' x, dx, y and dy.
    double largest = 0;
    for (const auto& text : shape_text) {
      const Shape2 s = parse_shape(text);
      bench::Footprint f;
      f.add_n(2, {s.out, s.in});
      f.add_n(2, {kFewRowsMax, s.in + s.out});
      largest = std::max(largest, f.bytes());
    }
    check_memory(largest, "bench_few_rows", "the largest weight with its gradient");
    if (weights == "bf16")
      run_bf16(shape_text, tokens, rounds, budget);
    else
      run(shape_text, tokens, rounds, budget);
  });
  return cli::run_program("bench_few_rows", app, argc, argv);
}

namespace {

void run(const std::vector<std::string>& shape_text, const std::vector<std::int64_t>& tokens,
         int rounds, double budget) {
  std::vector<Shape2> shapes;
  for (const auto& text : shape_text) shapes.push_back(parse_shape(text));

  fmt::print("{}\n", bench::measured_on("bench_few_rows"));
  fmt::print(
      "f32 (kernel set {}: f32 weights take its AVX2 kernel), median of {} alternating rounds ({} "
      "s each); x = oneDNN's time over "
      "the kernels' (fixed shape / run-time M for the forward, fixed for the backward)\n\n",
      enum_name(few_rows_isa()), rounds, budget);
  fmt::print("{:>12} {:>2} | {:>9} {:>9} {:>9} {:>6} {:>6} | {:>9} {:>9} {:>6}\n", "IN x OUT", "T",
             "fwd us", "dnn us", "dnn-rt us", "x", "x rt", "bwd us", "dnn us", "x");
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const std::string& text = shape_text[k];
    const Shape2 s = shapes[k];
    const Tensor w = bench::random({s.out, s.in}, 1), b = bench::random({s.out}, 2);
    for (auto T : tokens) {
      const Tensor x = bench::random({T, s.in}, 3), dy = bench::random({T, s.out}, 4);
      Tensor y({T, s.out}), dx({T, s.in}), dw({s.out, s.in}), db({s.out});
      std::vector<double> t[5];
      for (int r = 0; r < rounds; ++r) {
        t[0].push_back(bench::time_it([&] { few_rows_linear(y, x, w, &b); }, budget));
        t[1].push_back(bench::time_it(
            [&] {
              MatmulOptions o;
              o.bias = &b;
              matmul(y, x, Trans::no, w, Trans::yes, o);
            },
            budget));
        t[2].push_back(bench::time_it(
            [&] {
              MatmulOptions o;
              o.bias = &b;
              o.dynamic_m = true;
              matmul(y, x, Trans::no, w, Trans::yes, o);
            },
            budget));
        t[3].push_back(
            bench::time_it([&] { few_rows_linear_backward(&dx, dw, &db, dy, x, w); }, budget));
        t[4].push_back(bench::time_it(
            [&] {
              MatmulOptions o;
              matmul(dx, dy, Trans::no, w, Trans::no, o);
              o.accumulate = true;
              matmul(dw, dy, Trans::yes, x, Trans::no, o);
              bias_backward(db, dy);
            },
            budget));
      }
      double m[5];
      for (int i = 0; i < 5; ++i) m[i] = median(t[i]) * 1e6;
      fmt::print(
          "{:>12} {:>2} | {:>9.1f} {:>9.1f} {:>9.1f} {:>5.2f}x {:>5.2f}x | {:>9.1f} {:>9.1f} "
          "{:>5.2f}x\n",
          text, T, m[0], m[1], m[2], m[1] / m[0], m[2] / m[0], m[3], m[4], m[4] / m[3]);
      std::fflush(stdout);
    }
  }
}

void run_bf16(const std::vector<std::string>& shape_text, const std::vector<std::int64_t>& tokens,
              int rounds, double budget) {
  fmt::print("{}\n", bench::measured_on("bench_few_rows"));
  fmt::print(
      "bf16 weights, inference forward y = x·Wᵀ + b (kernel set {}), median of {} alternating "
      "rounds ({} s each); x = oneDNN's bf16 product's time over the kernels' (fixed shape / "
      "run-time M), 'rounds' each round's fixed-shape ratio, lowest to highest; now: whether "
      "a dense layer's up projection of this shape streams these rows (few_rows_bf16_max; a "
      "layer decides both its products by its up projection)\n\n",
      enum_name(few_rows_isa()), rounds, budget);
  fmt::print("{:>12} {:>2} | {:>9} {:>9} {:>9} {:>6} {:>6} {:>11} | {:>6}\n", "IN x OUT", "T",
             "fwd us", "dnn us", "dnn-rt us", "x", "x rt", "rounds", "now");
  for (const auto& text : shape_text) {
    const Shape2 s = parse_shape(text);
    const Tensor w = bench::random({s.out, s.in}, 1).to(DType::bf16), b = bench::random({s.out}, 2);
    for (auto T : tokens) {
      const Tensor x = bench::random({T, s.in}, 3);
      Tensor y({T, s.out});
      std::vector<double> t[3], ratio;
      for (int r = 0; r < rounds; ++r) {
        t[0].push_back(bench::time_it([&] { few_rows_linear(y, x, w, &b); }, budget));
        t[1].push_back(bench::time_it(
            [&] { linear_forward(y, x, w, &b, Precision::bf16, nullptr, false); }, budget));
        t[2].push_back(bench::time_it(
            [&] { linear_forward(y, x, w, &b, Precision::bf16, nullptr, true); }, budget));
        ratio.push_back(t[1].back() / t[0].back());
      }
      double m[3];
      for (int i = 0; i < 3; ++i) m[i] = median(t[i]) * 1e6;
      const auto [low, high] = std::minmax_element(ratio.begin(), ratio.end());
      fmt::print("{:>12} {:>2} | {:>9.1f} {:>9.1f} {:>9.1f} {:>5.2f}x {:>5.2f}x {:>11} | {:>6}\n",
                 text, T, m[0], m[1], m[2], m[1] / m[0], m[2] / m[0],
                 fmt::format("{:.2f}-{:.2f}", *low, *high),
                 few_rows_bf16_max(s.in, w.numel(), false) >= T ? "kernel" : "oneDNN");
      std::fflush(stdout);
    }
  }
}

}  // namespace
