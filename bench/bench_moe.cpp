// MoE benchmark: forward+backward of the MoE layer against k times the dense FFN of one expert
// at the same token count (the same matrix-product FLOPs), measured in the same run. The
// difference is what routing, permutation, un-permutation and the smaller per-expert products
// cost. Also reports the load balance of the routing that was timed.
//
//   bench_moe [--d-model 512] [--d-ff 2048] [--tokens 6400] [--experts 8] [--top-k 2]
//             [--expert relu|swiglu|...] [--seconds 2] [--json]
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

#include "bench_cli.hpp"
#include "bench_util.hpp"
#include "ffnlab/layers/dense_ffn.hpp"
#include "ffnlab/layers/moe_ffn.hpp"

using namespace ffnlab;

int main(int argc, char** argv) {
  std::int64_t D = 512, F = 2048, T = 6400;
  int E = 8, K = 2;
  std::string expert = "relu";
  double budget = 2.0;
  bool json = false;
  CLI::App app{
      "An MoE layer against k x the dense FFN of one expert (the same matrix FLOPs), "
      "inference forward, training forward and forward+backward, best of 3 interleaved rounds."};
  bench::positive_option(app, "--d-model", D, "model width D");
  bench::positive_option(app, "--d-ff", F, "expert width F");
  bench::positive_option(app, "--tokens", T, "tokens T");
  bench::positive_option(app, "--experts", E, "routed experts E");
  bench::positive_option(app, "--top-k", K, "experts per token");
  app.add_option("--expert", expert, "expert variant (relu, swiglu, ...)")->capture_default_str();
  bench::add_seconds_option(app, budget);
  app.add_flag("--json", json, "print JSON instead of a table");
  CLI11_PARSE(app, argc, argv);

  const FFNConfig dense_config = variant_config(expert, D, F, true);
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
                       {"load_cv", s.load_cv},
                       {"max_over_mean", s.max_over_mean}};
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
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
  fmt::print("\nrouting of the timed batch: tokens per expert [");
  for (std::size_t e = 0; e < s.tokens_per_expert.size(); ++e)
    fmt::print("{}{}", e ? " " : "", s.tokens_per_expert[e]);
  fmt::print("], load CV {:.3f}, max/mean {:.2f}\n", s.load_cv, s.max_over_mean);
  return 0;
}
