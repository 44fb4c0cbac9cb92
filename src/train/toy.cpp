// The tutorial's toy run: Adam on one FFN layer, fixed random batch, MSE.
#include "ffnlab/train/toy.hpp"

#include <fmt/format.h>

#include <random>

#include "check.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/ops/dropout.hpp"
#include "ffnlab/ops/loss.hpp"
#include "ffnlab/train/optimizer.hpp"

namespace ffnlab {

double toy_memory_bytes(const FFNConfig& ffn, const ToyConfig& c) {
  const double tokens = static_cast<double>(c.batch) * static_cast<double>(c.seq);
  return ffn_cost(ffn, c.batch * c.seq).f32.total() +
         6.0 * 4.0 * tokens * static_cast<double>(ffn.d_model);
}

std::vector<ToyStep> run_toy(const FFNConfig& ffn_config, const ToyConfig& c,
                             const std::function<bool()>& stop,
                             const std::function<void(int, const ToyStep&)>& done) {
  check(c.batch > 0 && c.seq > 0 && c.iterations > 0,
        "[toy] batch, seq and iterations must be positive");
  const std::int64_t T = checked_mul(c.batch, c.seq, "[toy] batch × seq"), D = ffn_config.d_model;
  check(checked_mul(T, D, "[toy] batch × seq × d_model") <= limits::kTokens,
        "[toy] batch × seq × d_model = {} × {} is more than 2^32 input values", T, D);
  auto ffn = make_ffn(ffn_config, c.seed);
  ffn->context().first_layer = true;  // a lone layer: no previous MoE layer's logits
  ffn->context().sequence = c.seq;    // batch sequences of seq tokens (expert choice routes each)
  Tensor x({T, D}), target({T, D});
  std::mt19937_64 rng(c.seed + 1);
  std::normal_distribution<float> normal(0.f, 1.f);
  float* xs = x.f32();
  float* ts = target.f32();
  for (std::int64_t i = 0; i < T * D; ++i) xs[i] = normal(rng);
  for (std::int64_t i = 0; i < T * D; ++i) ts[i] = normal(rng);
  // Byte ids for the rows, drawn after the data (hash routing chooses by them).
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T));
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % 256);
  ffn->context().token_ids = ids.data();

  OptimizerConfig oc;
  oc.kind = OptimizerKind::adam;
  oc.lr = c.lr;
  oc.beta1 = 0.9f;
  oc.beta2 = 0.999f;
  oc.weight_decay = 0.f;
  ParameterSet& ps = ffn->parameters();
  Optimizer opt(oc, ps, [](const Parameter&) { return false; });
  std::vector<ToyStep> out;
  Tensor xd, y, dy, dx;
  for (int it = 0; it < c.iterations; ++it) {
    if (stop && stop())
      throw Interrupted(fmt::format("{}: the toy run stopped at iteration {} of {}", stop_reason(),
                                    it, c.iterations));
    ps.zero_grad();
    ffn->set_random_stream(c.seed, static_cast<std::uint64_t>(it));
    dropout_forward(xd, x, c.dropout, c.seed, static_cast<std::uint64_t>(it));
    ffn->forward(y, xd, true);
    ToyStep s;
    s.loss = mse_forward(y, target) + ffn->aux_loss();
    mse_backward(dy, y, target, 1.f);
    ffn->backward(dx, dy);
    s.grad_norm = global_norm(ps.grads());
    check(std::isfinite(s.loss) && std::isfinite(s.grad_norm),
          "[toy] iteration {}: loss {} / gradient norm {} is not finite", it + 1, s.loss,
          s.grad_norm);
    opt.step(c.lr);
    ffn->after_optimizer_step();
    out.push_back(s);
    if (done) done(it + 1, s);
  }
  return out;
}

}  // namespace ffnlab
