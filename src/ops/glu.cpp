// The gated product act(g) ⊙ u summed over branches, forward and backward, in one pass.
#include "ffnlab/ops/glu.hpp"

#include <algorithm>

#include "activation_kernels.hpp"
#include "check.hpp"

namespace ffnlab {

namespace {

// Columns per work item: the loop runs over (row, column block) so that one token with a wide
// F (inference) is split across threads as well as many tokens are.
constexpr std::int64_t kColumnBlock = 512;

void check_glu(const Tensor& h, const Tensor& a, int branches, const char* what) {
  check(branches >= 1, "[glu] branches = {} must be >= 1", branches);
  check(
      h.rank() == 2 && a.rank() == 2 && a.dim(0) == h.dim(0) && a.dim(1) == 2 * branches * h.dim(1),
      "[glu] {}: a {} does not match h {} with {} branch(es)", what, shape_string(a.shape()),
      shape_string(h.shape()), branches);
}

}  // namespace

void glu_forward(Tensor& h, const Tensor& a, Act act, int branches) {
  check_glu(h, a, branches, "forward");
  const std::int64_t T = h.dim(0), F = h.dim(1), P = a.dim(1);
  const std::int64_t blocks = (F + kColumnBlock - 1) / kColumnBlock;
  const float* in = a.f32();
  float* out = h.f32();
  kernels::dispatch(act.kind, [&](auto tag) {
    constexpr Activation A = decltype(tag)::value;
    const float beta = act.beta;
#pragma omp parallel for collapse(2) schedule(static) if (T * F > kernels::kParallelGrain)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        const std::int64_t f0 = blk * kColumnBlock, f1 = std::min(F, f0 + kColumnBlock);
        float* hr = out + t * F;
        for (int b = 0; b < branches; ++b) {
          const float* g = in + t * P + 2 * b * F;
          const float* u = g + F;
          if (b == 0) {
#pragma omp simd
            for (std::int64_t f = f0; f < f1; ++f) hr[f] = kernels::act_value<A>(g[f], beta) * u[f];
          } else {
#pragma omp simd
            for (std::int64_t f = f0; f < f1; ++f)
              hr[f] += kernels::act_value<A>(g[f], beta) * u[f];
          }
        }
      }
  });
}

void glu_backward(Tensor& da, const Tensor& dh, const Tensor& a, Act act, int branches) {
  check_glu(dh, a, branches, "backward");
  check(da.shape() == a.shape(), "[glu] da {} must have the shape of a {}",
        shape_string(da.shape()), shape_string(a.shape()));
  const std::int64_t T = dh.dim(0), F = dh.dim(1), P = a.dim(1);
  const std::int64_t blocks = (F + kColumnBlock - 1) / kColumnBlock;
  const float* in = a.f32();
  const float* d = dh.f32();
  float* out = da.f32();
  kernels::dispatch(act.kind, [&](auto tag) {
    constexpr Activation A = decltype(tag)::value;
    const float beta = act.beta;
#pragma omp parallel for collapse(2) schedule(static) if (T * F > kernels::kParallelGrain)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        const std::int64_t f0 = blk * kColumnBlock, f1 = std::min(F, f0 + kColumnBlock);
        const float* dr = d + t * F;
        for (int b = 0; b < branches; ++b) {
          const float* g = in + t * P + 2 * b * F;
          const float* u = g + F;
          float* dg = out + t * P + 2 * b * F;
          float* du = dg + F;
          if constexpr (kernels::has_value_grad(A)) {
#pragma omp simd
            for (std::int64_t f = f0; f < f1; ++f) {
              const kernels::ValueGrad vg = kernels::value_grad<A>(g[f], beta);
              dg[f] = dr[f] * u[f] * vg.grad;
              du[f] = dr[f] * vg.value;
            }
          } else {
#pragma omp simd
            for (std::int64_t f = f0; f < f1; ++f) {
              dg[f] = kernels::grad_times<A>(dr[f] * u[f], g[f], beta);
              du[f] = dr[f] * kernels::act_value<A>(g[f], beta);
            }
          }
        }
      }
  });
}

void mix_forward(Tensor& h, const Tensor& a, Act act, int branches) {
  if (branches == 0)
    activation_forward(h, a, act);
  else
    glu_forward(h, a, act, branches);
}

void mix_backward(Tensor& da, const Tensor& dh, const Tensor& a, Act act, int branches) {
  if (branches == 0)
    activation_backward(da, dh, a, act);
  else
    glu_backward(da, dh, a, act, branches);
}

bool mix_in_epilogue(Act act, int branches, bool train) {
  return branches == 0 && (!train || derivative_from_output(act));
}

void mix_backward(Tensor& da, const Tensor& dh, const Tensor& a, const Tensor& h, Act act,
                  int branches) {
  if (mix_in_epilogue(act, branches, /*train=*/true))
    activation_backward_from_output(da, dh, h, act);
  else
    mix_backward(da, dh, a, act, branches);
}

}  // namespace ffnlab
