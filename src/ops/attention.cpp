// Causal attention: head-major copies of q, k, v; P = softmax(q·kᵀ) per head through one batched
// oneDNN product; O = P·v through another; the copies back. Backward mirrors it with four
// batched products. Rows of the softmax are independent (parallel over B·H·S rows).
#include "ffnlab/ops/attention.hpp"

#include <cmath>

#include "activation_kernels.hpp"
#include "check.hpp"
#include "ffnlab/scratch.hpp"

namespace ffnlab {

namespace {

struct Dims {
  std::int64_t B, S, H, dh, D;
};

Dims dims_of(const Tensor& qkv, std::int64_t seq, std::int64_t heads) {
  check(qkv.rank() == 2 && seq > 0 && heads > 0 && qkv.dim(0) % seq == 0 &&
            qkv.dim(1) % (3 * heads) == 0,
        "[attention] qkv {} does not split into sequences of {} and 3 x {} heads",
        shape_string(qkv.shape()), seq, heads);
  const std::int64_t D = qkv.dim(1) / 3;
  return {qkv.dim(0) / seq, seq, heads, D / heads, D};
}

// head-major [B·H, S, dh] <-> token-major columns [col0, col0 + D) of a [B·S, width] matrix.
void to_heads(Tensor& dst, const float* src, std::int64_t width, std::int64_t col0, const Dims& d,
              float scale) {
  float* out = dst.f32();
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.H; ++h)
      for (std::int64_t s = 0; s < d.S; ++s) {
        const float* in = src + (b * d.S + s) * width + col0 + h * d.dh;
        float* o = out + ((b * d.H + h) * d.S + s) * d.dh;
#pragma omp simd
        for (std::int64_t i = 0; i < d.dh; ++i) o[i] = in[i] * scale;
      }
}

void from_heads(float* dst, std::int64_t width, std::int64_t col0, const Tensor& src, const Dims& d,
                float scale) {
  const float* in = src.f32();
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.H; ++h)
      for (std::int64_t s = 0; s < d.S; ++s) {
        float* o = dst + (b * d.S + s) * width + col0 + h * d.dh;
        const float* r = in + ((b * d.H + h) * d.S + s) * d.dh;
#pragma omp simd
        for (std::int64_t i = 0; i < d.dh; ++i) o[i] = r[i] * scale;
      }
}

}  // namespace

void attention_forward(Tensor& out, AttentionCache& c, const Tensor& qkv, std::int64_t seq,
                       std::int64_t heads, bool causal, Precision precision) {
  const Dims d = dims_of(qkv, seq, heads);
  const std::int64_t G = d.B * d.H;
  const Shape hs{G, d.S, d.dh};
  c.q.ensure(hs);
  c.k.ensure(hs);
  c.v.ensure(hs);
  Tensor& o = scratch(Scratch::attn_o, hs);
  c.p.ensure({G, d.S, d.S});
  out.ensure({d.B * d.S, d.D});
  const float scale = 1.f / std::sqrt(static_cast<float>(d.dh));
  to_heads(c.q, qkv.f32(), 3 * d.D, 0, d, scale);
  to_heads(c.k, qkv.f32(), 3 * d.D, d.D, d, 1.f);
  to_heads(c.v, qkv.f32(), 3 * d.D, 2 * d.D, d, 1.f);
  matmul(c.p, c.q, Trans::no, c.k, Trans::yes, {.precision = precision});

  float* p = c.p.f32();
  const std::int64_t S = d.S;
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < G * S; ++r) {
    const std::int64_t i = causal ? r % S : S - 1;  // keys 0..i are visible
    float* row = p + r * S;
    float mx;
    const float inv = 1.f / kernels::exp_minus_max(row, row, i + 1, &mx);
#pragma omp simd
    for (std::int64_t j = 0; j <= i; ++j) row[j] *= inv;
#pragma omp simd
    for (std::int64_t j = i + 1; j < S; ++j) row[j] = 0.f;
  }
  matmul(o, c.p, Trans::no, c.v, Trans::no, {.precision = precision});
  from_heads(out.f32(), d.D, 0, o, d, 1.f);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, AttentionCache& c, std::int64_t seq,
                        std::int64_t heads, bool causal, Precision precision) {
  check(c.p.defined(), "[attention] backward without a forward");
  const std::int64_t G = c.p.dim(0), S = c.p.dim(1), dh = c.q.dim(2);
  const Dims d{G / heads, seq, heads, dh, heads * dh};
  check(dout.rank() == 2 && dout.dim(0) == d.B * S && dout.dim(1) == d.D,
        "[attention] dout {} does not match the forward's [{}, {}]", shape_string(dout.shape()),
        d.B * S, d.D);
  const Shape hs{G, S, dh};
  Tensor& dq = scratch(Scratch::attn_dq, hs);
  Tensor& dk = scratch(Scratch::attn_dk, hs);
  Tensor& dv = scratch(Scratch::attn_dv, hs);
  Tensor& dpt = scratch(Scratch::attn_dp, {G, S, S});
  dqkv.ensure({d.B * S, 3 * d.D});
  Tensor& dout_heads = scratch(Scratch::attn_o, hs);
  to_heads(dout_heads, dout.f32(), d.D, 0, d, 1.f);
  const MatmulOptions opt{.precision = precision};
  matmul(dpt, dout_heads, Trans::no, c.v, Trans::yes, opt);
  matmul(dv, c.p, Trans::yes, dout_heads, Trans::no, opt);
  // dS = P ⊙ (dP − Σ_j P·dP), in place in dp; zero above the diagonal because P is.
  float* p = c.p.f32();
  float* dp = dpt.f32();
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < G * S; ++r) {
    const std::int64_t i = causal ? r % S : S - 1;
    const float* pr = p + r * S;
    float* g = dp + r * S;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (std::int64_t j = 0; j <= i; ++j) dot += pr[j] * g[j];
#pragma omp simd
    for (std::int64_t j = 0; j < S; ++j) g[j] = pr[j] * (g[j] - dot);
  }
  matmul(dq, dpt, Trans::no, c.k, Trans::no, opt);
  matmul(dk, dpt, Trans::yes, c.q, Trans::no, opt);
  const float scale = 1.f / std::sqrt(static_cast<float>(dh));
  from_heads(dqkv.f32(), 3 * d.D, 0, dq, d, scale);
  from_heads(dqkv.f32(), 3 * d.D, d.D, dk, d, 1.f);
  from_heads(dqkv.f32(), 3 * d.D, 2 * d.D, dv, d, 1.f);
}

}  // namespace ffnlab
