// Soft MoE: its parameters, forward and backward (soft_moe.hpp).
#include "ffnlab/layers/moe/soft_moe.hpp"

#include <algorithm>
#include <cmath>

#include "ffnlab/ops/l2_normalize.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/matmul.hpp"
#include "ffnlab/scratch.hpp"

namespace ffnlab {

namespace {

// Between a [B, M, D] buffer of slots (sequence-major) and the experts' rows (expert e's block
// holds its p slots of every sequence: row e·B·p + b·p + i for slot e·p + i of sequence b):
// slots into rows, or (back) rows into slots.
void slots_to_rows(float* rows, float* slots, std::int64_t B, std::int64_t E, std::int64_t p,
                   std::int64_t D, bool back) {
  const std::int64_t M = E * p;
#pragma omp parallel for schedule(static) if (B * M * D > 65536)
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t m = 0; m < M; ++m) {
      float* row = rows + ((m / p) * B * p + b * p + m % p) * D;
      float* slot = slots + (b * M + m) * D;
      if (back)
        std::copy(row, row + D, slot);
      else
        std::copy(slot, slot + D, row);
    }
}

}  // namespace

void SoftMoE::declare(ParameterSet& params) const {
  const std::int64_t M = std::int64_t{layer_.moe.num_experts} * layer_.moe.slots;
  params.declare("gate.phi", {M, layer_.d_model});
  params.declare("gate.scale", {1});
}

void SoftMoE::bind(ParameterSet& params) {
  phi_ = params.at("gate.phi").value;
  dphi_ = params.at("gate.phi").grad;
  scale_ = params.at("gate.scale").value;
  dscale_ = params.at("gate.scale").grad;
}

void SoftMoE::init(std::mt19937_64& rng) {
  init_normal(phi_, 1.0f / std::sqrt(static_cast<float>(layer_.d_model)), rng);
  scale_.f32()[0] = 1.0f;
}

// Per sequence of S tokens: logits L = X̃·Φ̃ᵀ with X̃ the l2-normalised tokens and Φ̃ = scale·the
// l2-normalised slot parameters; dispatch D = softmax of L over the tokens (per slot), combine
// C = softmax over the slots (per token); slot inputs X̄ = Dᵀ·X, each expert runs its p slots of
// every sequence in one block, y = C·Ȳ.
void SoftMoE::forward(Tensor& y, Routing& r, const Tensor& x, std::int64_t sequence,
                      ExpertStack& experts, bool train, Precision precision, ProcessGroup* group) {
  const MoEConfig& m = layer_.moe;
  const std::int64_t T = x.dim(0), D = layer_.d_model, E = m.num_experts, p = m.slots;
  const std::int64_t M = E * p, S = sequence > 0 ? sequence : T, B = T > 0 ? T / S : 0;
  Cache& c = cache_;
  c.sequences = B;
  c.sequence = S;
  l2_normalize_forward(c.xn, c.x_inv, x, 1.0f);
  l2_normalize_forward(c.phin, c.phi_inv, phi_, scale_.f32()[0]);
  c.combine.ensure({T, M});
  if (T > 0) linear_forward(c.combine, c.xn, c.phin, nullptr);  // the logits, then in place:
  std::vector<double> sums{static_cast<double>(T), 0.0, 0.0};   // tokens, Σ entropy, Σ top
  soft_route(c.dispatch, c.combine, c.combine, S, &sums[1], &sums[2]);
  // Slot inputs X̄ [B, M, D] = Dᵀ·X per sequence, into the experts' rows.
  c.slots_out.ensure({B, M, D});  // (X̄ first: the experts' outputs replace it below)
  ExpertStack::Rows& rows = experts.rows();
  rows.xp.ensure({B * M, D});
  if (T > 0) {
    matmul(c.slots_out, c.dispatch.reshape({B, S, M}), Trans::yes, x.reshape({B, S, D}), Trans::no);
    slots_to_rows(rows.xp.f32(), c.slots_out.f32(), B, E, p, D, /*back=*/false);
  }
  c.offsets.assign(static_cast<std::size_t>(E + 1), 0);
  for (std::int64_t e = 0; e <= E; ++e) c.offsets[e] = e * B * p;
  experts.forward(c.offsets, nullptr, train, precision);
  y.ensure({T, D});
  if (T > 0) {
    slots_to_rows(rows.op.f32(), c.slots_out.f32(), B, E, p, D, /*back=*/true);
    Tensor y3 = y.reshape({B, S, D});
    matmul(y3, c.combine.reshape({B, S, M}), Trans::no, c.slots_out, Trans::no);
  }

  // What the statistics read: every expert processes p slots of every sequence.
  if (train && group) group->allreduce_sum(sums, "router statistics");
  r = Routing{};
  r.tokens = T;
  r.total_tokens = static_cast<std::int64_t>(sums[0]);
  r.experts = r.ffn_experts = static_cast<int>(E);
  r.sequence = S;
  r.offsets = c.offsets;
  // p slots of every rank's sequences (none without tokens)
  const std::int64_t per_expert = S > 0 ? r.total_tokens / S * p : 0;
  r.load.assign(static_cast<std::size_t>(E), per_expert);
  r.kept_total.assign(static_cast<std::size_t>(E), per_expert);
  r.first.assign(static_cast<std::size_t>(E), 0);
  const double inv_t = r.total_tokens > 0 ? 1.0 / static_cast<double>(r.total_tokens) : 0.0;
  r.entropy = sums[1] * inv_t;
  r.top1_prob = sums[2] * inv_t;
}

void SoftMoE::backward(Tensor& dx, const Tensor& dy, const Tensor& x, ExpertStack& experts,
                       Precision precision) {
  const MoEConfig& m = layer_.moe;
  Cache& c = cache_;
  const std::int64_t T = x.dim(0), D = layer_.d_model, E = m.num_experts, p = m.slots;
  const std::int64_t M = E * p, S = c.sequence, B = c.sequences;
  dx.ensure({T, D});
  if (T == 0) return;
  const Tensor dy3 = dy.reshape({B, S, D}), x3 = x.reshape({B, S, D});
  const Tensor comb3 = c.combine.reshape({B, S, M}), disp3 = c.dispatch.reshape({B, S, M});
  // y = C·Ȳ: dȲ = Cᵀ·dy, dC = dy·Ȳᵀ.
  c.dslots.ensure({B, M, D});
  c.dlogits.ensure({B, S, M});
  c.ddispatch.ensure({B, S, M});
  matmul(c.dslots, comb3, Trans::yes, dy3, Trans::no);
  matmul(c.dlogits, dy3, Trans::no, c.slots_out, Trans::yes);  // dC, for now
  Tensor& dop = scratch(Scratch::moe_dop, {B * M, D});
  slots_to_rows(dop.f32(), c.dslots.f32(), B, E, p, D, /*back=*/false);
  Tensor& dxp = experts.backward(dop, c.offsets, precision);
  slots_to_rows(dxp.f32(), c.dslots.f32(), B, E, p, D, /*back=*/true);  // dX̄
  // X̄ = Dᵀ·X: dX = D·dX̄, dD = X·dX̄ᵀ.
  Tensor dx3 = dx.reshape({B, S, D});
  matmul(dx3, disp3, Trans::no, c.dslots, Trans::no);
  matmul(c.ddispatch, x3, Trans::no, c.dslots, Trans::yes);
  // Both softmaxes back to the logits (dC's buffer becomes dL).
  soft_route_backward(c.dlogits, c.dlogits, c.ddispatch, c.dispatch, c.combine, S);
  // L = X̃·Φ̃ᵀ: dX̃ = dL·Φ̃, dΦ̃ = dLᵀ·X̃; then through the normalisations (and the scale).
  const Tensor dL2 = c.dlogits.reshape({T, M});
  c.dxn.ensure({T, D});
  c.dphin.ensure({M, D});
  matmul(c.dxn, dL2, Trans::no, c.phin, Trans::no);
  matmul(c.dphin, dL2, Trans::yes, c.xn, Trans::no);
  l2_normalize_backward(dx, nullptr, c.dxn, x, c.x_inv, 1.0f);
  // Φ̃ = scale·Φ/|Φ|: the scale's gradient too.
  l2_normalize_backward(dphi_, dscale_.f32(), c.dphin, phi_, c.phi_inv, scale_.f32()[0]);
}

}  // namespace ffnlab
