// MoE benchmark: forward+backward of the MoE layer against k times the dense FFN of one expert
// at the same token count (the same matrix-product FLOPs), measured in the same run. The
// difference is what routing, permutation, un-permutation and the smaller per-expert products
// cost. Also reports the load balance of the routing that was timed.
//
// Then the expert products alone, on the row counts the timed routing gave: what the smaller
// products cost by their shapes, apart from routing, permutation and mixing; and the same
// products batched over the experts, padded to the largest block (one call instead of E).
//
//   bench_moe [--d-model 512] [--d-ff 2048] [--tokens 6400] [--experts 8] [--top-k 2]
//             [--expert relu|swiglu|...] [--seconds 2] [--json]
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cli.hpp"
#include "bench_util.hpp"
#include "ffnlab/layers/dense_ffn.hpp"
#include "ffnlab/layers/moe_ffn.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/matmul.hpp"

using namespace ffnlab;

namespace {

// Seconds of the six products of one training step of experts with the given row counts
// (forward x·W_inᵀ and h·W_outᵀ, backward dx, dh and both weight gradients), no bias or
// activation. ways: 0 each block one fixed-shape product (matmul), 1 as the MoE runs them
// (linear_forward/linear_backward with varying rows), 2 one batched product per kind over
// the experts padded to the largest block (the padding's copies not timed).
struct ExpertProducts {
  std::int64_t D, F, Fin;
  std::vector<std::int64_t> rows;
  std::int64_t max_rows = 0, total = 0;
  std::vector<Tensor> w_in, w_out, dw_in, dw_out;
  Tensor x, h, a, dout, dh, da, dx, o;  // rows stacked by expert; batched: [E, max_rows, ·]
  Tensor bx, bh, ba, bdout, bdh, bda, bdx, bo, bw_in, bw_out, bdw_in, bdw_out;

  ExpertProducts(std::int64_t d, std::int64_t f, std::int64_t fin, std::vector<std::int64_t> r,
                 bool distinct_weights)
      : D(d), F(f), Fin(fin), rows(std::move(r)) {
    const auto E = static_cast<std::int64_t>(rows.size());
    for (auto n : rows) max_rows = std::max(max_rows, n), total += n;
    for (std::int64_t e = 0; e < (distinct_weights ? E : 1); ++e) {
      w_in.push_back(bench::random({Fin, D}, 10 + 2 * e));
      w_out.push_back(bench::random({D, F}, 11 + 2 * e));
      dw_in.emplace_back(Shape{Fin, D});
      dw_out.emplace_back(Shape{D, F});
    }
    x = bench::random({total, D}, 4), h = bench::random({total, F}, 5);
    dout = bench::random({total, D}, 6), da = bench::random({total, Fin}, 7);
    a = Tensor({total, Fin}), dh = Tensor({total, F}), dx = Tensor({total, D});
    o = Tensor({total, D});
    bx = bench::random({E, max_rows, D}, 4), bh = bench::random({E, max_rows, F}, 5);
    bdout = bench::random({E, max_rows, D}, 6), bda = bench::random({E, max_rows, Fin}, 7);
    ba = Tensor({E, max_rows, Fin}), bo = Tensor({E, max_rows, D});
    bdh = Tensor({E, max_rows, F}), bdx = Tensor({E, max_rows, D});
    bw_in = bench::random({E, Fin, D}, 10), bw_out = bench::random({E, D, F}, 11);
    bdw_in = Tensor({E, Fin, D}), bdw_out = Tensor({E, D, F});
  }

  void run(int way) {
    MatmulOptions acc;  // weight gradients accumulate, as a layer's do
    acc.accumulate = true;
    if (way == 2) {
      matmul(ba, bx, Trans::no, bw_in, Trans::yes);
      matmul(bo, bh, Trans::no, bw_out, Trans::yes);
      matmul(bdh, bdout, Trans::no, bw_out, Trans::no);
      matmul(bdx, bda, Trans::no, bw_in, Trans::no);
      matmul(bdw_out, bdout, Trans::yes, bh, Trans::no, acc);
      matmul(bdw_in, bda, Trans::yes, bx, Trans::no, acc);
      return;
    }
    std::int64_t r0 = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::size_t e = std::min(i, w_in.size() - 1);  // one weight set: k x one expert
      const std::int64_t r1 = r0 + rows[i];
      if (rows[i] > 0) {
        Tensor ae = a.rows(r0, r1), oe = o.rows(r0, r1), dhe = dh.rows(r0, r1),
               dxe = dx.rows(r0, r1);
        if (way == 0) {
          matmul(ae, x.rows(r0, r1), Trans::no, w_in[e], Trans::yes);
          matmul(oe, h.rows(r0, r1), Trans::no, w_out[e], Trans::yes);
          matmul(dhe, dout.rows(r0, r1), Trans::no, w_out[e], Trans::no);
          matmul(dxe, da.rows(r0, r1), Trans::no, w_in[e], Trans::no);
          matmul(dw_out[e], dout.rows(r0, r1), Trans::yes, h.rows(r0, r1), Trans::no, acc);
          matmul(dw_in[e], da.rows(r0, r1), Trans::yes, x.rows(r0, r1), Trans::no, acc);
        } else {
          linear_forward(ae, x.rows(r0, r1), w_in[e], nullptr, Precision::f32, nullptr, true);
          linear_forward(oe, h.rows(r0, r1), w_out[e], nullptr, Precision::f32, nullptr, true);
          linear_backward(&dhe, dw_out[e], nullptr, dout.rows(r0, r1), h.rows(r0, r1), w_out[e],
                          Precision::f32, true);
          linear_backward(&dxe, dw_in[e], nullptr, da.rows(r0, r1), x.rows(r0, r1), w_in[e],
                          Precision::f32, true);
        }
      }
      r0 = r1;
    }
  }
};

// The variants an expert may be: the dense kinds an MoE's experts take (plain and GLU).
std::vector<std::string> expert_variants() {
  std::vector<std::string> out;
  for (const auto& v : variant_names()) {
    const FFNKind kind = variant_config(v, 1, 1, true).kind;
    if (kind == FFNKind::plain || kind == FFNKind::glu) out.push_back(v);
  }
  return out;
}

// Bytes of the two layers, their inputs and gradients, and the products' tensors when the
// largest expert block has `max_rows` rows (ExpertProducts: stacked rows, and batched
// [E, max_rows, ·]).
bench::Footprint footprint(std::int64_t D, std::int64_t F, std::int64_t Fin, std::int64_t T,
                           std::int64_t E, std::int64_t K, std::int64_t max_rows) {
  bench::Footprint f;
  f.add_n(2, {Fin + F, D});     // the dense layer: weights and gradients
  f.add_n(2, {E, Fin + F, D});  // the MoE's experts
  f.add_n(2, {E, D});           // and router
  f.add_n(4, {T, D});           // x, dy, y, dx
  f.add({T, Fin + F});          // the dense layer's activations
  f.add({T, K, D + Fin + F});   // the MoE's routed rows and their activations
  // The products: K x one expert (K blocks of T rows), then the routed blocks (T·K rows).
  const auto products = [&](std::int64_t experts, std::int64_t weight_sets, std::int64_t rows) {
    f.add({T, K, 4 * D + 2 * F + 2 * Fin});              // stacked
    f.add({experts, rows, 4 * D + 2 * F + 2 * Fin});     // batched, padded
    f.add_n(2 * (weight_sets + experts), {Fin + F, D});  // weights, gradients; batched too
  };
  products(K, 1, T);
  products(E, E, max_rows);
  return f;
}

void run(std::int64_t D, std::int64_t F, std::int64_t Fin, std::int64_t T, int E, int K,
         const std::string& expert, const FFNConfig& dense_config, double budget, bool json) {
  FFNConfig moe_config = variant_config("moe", D, F, true);
  moe_config.act = dense_config.act;
  moe_config.moe.expert_kind = dense_config.kind;
  moe_config.moe.num_experts = E;
  moe_config.moe.top_k = K;
  moe_config.moe.aux_coef = 0.01f;
  DenseFFN dense(dense_config, 1);
  MoEFFN moe(moe_config, 1);

  const Tensor x = bench::random({T, D}, 2), dy = bench::random({T, D}, 3);
  Tensor y, dx;
  auto dense_step = [&] {
    dense.forward(y, x, true);
    dense.backward(dx, dy);
  };
  auto moe_step = [&] {
    moe.forward(y, x, true);
    moe.backward(dx, dy);
  };
  // Interleaved rounds, so that drift of the shared machine hits both sides alike.
  double dense_inf = 1e30, moe_inf = 1e30, dense_fwd = 1e30, moe_fwd = 1e30, dense_fb = 1e30,
         moe_fb = 1e30;
  for (int round = 0; round < 3; ++round) {
    dense_inf =
        std::min(dense_inf, bench::time_it([&] { dense.forward(y, x, false); }, budget / 8));
    moe_inf = std::min(moe_inf, bench::time_it([&] { moe.forward(y, x, false); }, budget / 8));
    dense_fwd = std::min(dense_fwd, bench::time_it([&] { dense.forward(y, x, true); }, budget / 8));
    moe_fwd = std::min(moe_fwd, bench::time_it([&] { moe.forward(y, x, true); }, budget / 8));
    dense_fb = std::min(dense_fb, bench::time_it(dense_step, budget / 8));
    moe_fb = std::min(moe_fb, bench::time_it(moe_step, budget / 8));
  }
  const FFNStats s = moe.stats();

  // The expert products alone: k blocks of T rows with one expert's weights (what k x dense
  // computes, reading the same weights k times) against the routed blocks with each expert's
  // own weights.
  std::int64_t max_rows = 0;
  for (auto n : s.tokens_per_expert) max_rows = std::max(max_rows, n);
  footprint(D, F, Fin, T, E, K, max_rows)
      .check("bench_moe", "timing the products on the routed blocks (padded to the largest)");
  ExpertProducts dense_products(D, F, Fin, std::vector<std::int64_t>(K, T), false);
  ExpertProducts expert_products(D, F, Fin, s.tokens_per_expert, true);
  double products[4] = {1e30, 1e30, 1e30, 1e30};  // k x one; fixed shapes; as the MoE; batched
  for (int round = 0; round < 3; ++round) {
    products[0] = std::min(products[0], bench::time_it([&] { dense_products.run(0); }, budget / 8));
    for (int way = 0; way < 3; ++way)
      products[way + 1] = std::min(products[way + 1],
                                   bench::time_it([&] { expert_products.run(way); }, budget / 8));
  }
  const double products_overhead = products[1] / products[0] - 1.0;
  const double linear_overhead = products[2] / products[0] - 1.0;
  const double batched_overhead = products[3] / products[0] - 1.0;

  const double inf_overhead = moe_inf / (K * dense_inf) - 1.0;
  const double fwd_overhead = moe_fwd / (K * dense_fwd) - 1.0;
  const double fb_overhead = moe_fb / (K * dense_fb) - 1.0;

  if (json) {
    nlohmann::json out{{"d_model", D},
                       {"d_ff", F},
                       {"tokens", T},
                       {"experts", E},
                       {"top_k", K},
                       {"expert", expert},
                       {"dense_inference_s", dense_inf},
                       {"moe_inference_s", moe_inf},
                       {"inference_overhead", inf_overhead},
                       {"dense_forward_s", dense_fwd},
                       {"moe_forward_s", moe_fwd},
                       {"dense_forward_backward_s", dense_fb},
                       {"moe_forward_backward_s", moe_fb},
                       {"forward_overhead", fwd_overhead},
                       {"forward_backward_overhead", fb_overhead},
                       {"products_k_x_one_s", products[0]},
                       {"products_fixed_shapes_s", products[1]},
                       {"products_as_the_moe_s", products[2]},
                       {"products_batched_s", products[3]},
                       {"products_overhead", products_overhead},
                       {"products_as_the_moe_overhead", linear_overhead},
                       {"products_batched_overhead", batched_overhead},
                       {"load_cv", s.load_cv},
                       {"max_over_mean", s.max_over_mean},
                       {"machine", this_machine().describe()},
                       {"threads", bench::threads()}};
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("{}\n", bench::measured_on("bench_moe"));
  fmt::print(
      "MoE ({} experts of {} d_ff {}, top-{}, d_model {}, bias, f32) against {} x the dense FFN "
      "of one expert, {} tokens, inference forward, training forward (+ backward); best of 3 "
      "interleaved rounds.\n\n",
      E, expert, F, K, D, K, T);
  fmt::print("{:<18} {:>12} {:>12} {:>10}\n", "", "k x dense", "MoE", "overhead");
  fmt::print("{:<18} {:>10.1f}ms {:>10.1f}ms {:>9.1f}%\n", "inference forward", K * dense_inf * 1e3,
             moe_inf * 1e3, inf_overhead * 100);
  fmt::print("{:<18} {:>10.1f}ms {:>10.1f}ms {:>9.1f}%\n", "training forward", K * dense_fwd * 1e3,
             moe_fwd * 1e3, fwd_overhead * 100);
  fmt::print("{:<18} {:>10.1f}ms {:>10.1f}ms {:>9.1f}%\n", "forward+backward", K * dense_fb * 1e3,
             moe_fb * 1e3, fb_overhead * 100);
  fmt::print(
      "\nThe six products of a training step alone (no bias, activation, routing or mixing), "
      "on the timed routing's blocks:\n");
  fmt::print("{:<44} {:>10.1f}ms\n", fmt::format("{} x one expert, {} rows", K, T),
             products[0] * 1e3);
  fmt::print("{:<44} {:>10.1f}ms {:>9.1f}%\n", "each expert's block, one fixed shape",
             products[1] * 1e3, products_overhead * 100);
  fmt::print("{:<44} {:>10.1f}ms {:>9.1f}%\n", "each expert's block, as the MoE runs it",
             products[2] * 1e3, linear_overhead * 100);
  fmt::print("{:<44} {:>10.1f}ms {:>9.1f}%\n",
             fmt::format("batched over experts, padded to {} rows", expert_products.max_rows),
             products[3] * 1e3, batched_overhead * 100);
  fmt::print("\nrouting of the timed batch: tokens per expert [");
  for (std::size_t e = 0; e < s.tokens_per_expert.size(); ++e)
    fmt::print("{}{}", e ? " " : "", s.tokens_per_expert[e]);
  fmt::print("], load CV {:.3f}, max/mean {:.2f}\n", s.load_cv, s.max_over_mean);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t D = 512, F = 2048, T = 6400;
  int E = 8, K = 2;
  std::string expert = "relu";
  double budget = 2.0;
  bool json = false;
  CLI::App app{
      "An MoE layer against k x the dense FFN of one expert (the same matrix FLOPs), "
      "inference forward, training forward and forward+backward, best of 3 interleaved rounds; "
      "then the six products of a training step alone on the routed blocks (each a fixed "
      "shape, as the MoE runs them, and batched over the experts padded to the largest block) "
      "against k x one expert's: the part of the overhead that is the products' shapes.\n"
      "Exit status: 0 done, 1 refused (more memory than there is), 2 a bad flag, 3 out of "
      "memory or a failed write."};
  bench::width_option(app, "--d-model", D, "model width D");
  bench::width_option(app, "--d-ff", F, "expert width F");
  bench::int_option(app, "--tokens", T, 1, limits::kTokens, "tokens T (one step)");
  bench::int_option(app, "--experts", E, 1, limits::kExperts, "routed experts E");
  bench::int_option(app, "--top-k", K, 1, limits::kExperts, "experts per token, at most E");
  const std::vector<std::string> experts = expert_variants();
  app.add_option("--expert", expert, "the experts' variant")
      ->check(bench::one_of(experts))
      ->capture_default_str();
  bench::add_seconds_option(app, budget);
  app.add_flag("--json", json, "print JSON instead of a table");
  app.callback([&] {
    if (K > E) throw cli::UsageError(fmt::format("--top-k: {} is more than --experts ({})", K, E));
    const FFNConfig dense_config = variant_config(expert, D, F, true);
    const std::int64_t Fin = dense_config.in_width();
    // Before anything is allocated: the largest block has at least T·K/E rows.
    footprint(D, F, Fin, T, E, K, (T * K + E - 1) / E).check("bench_moe", "this run");
    run(D, F, Fin, T, E, K, expert, dense_config, budget, json);
  });
  return cli::run_program("bench_moe", app, argc, argv);
}
