// Activation forward/backward over tensors: name table, argument checks, parallel loops.
#include "ffnlab/ops/activation.hpp"

#include "activation_kernels.hpp"
#include "check.hpp"

namespace ffnlab {

void activation_forward(float* y, const float* x, std::int64_t n, Act act) {
  kernels::dispatch(act.kind, [&](auto a) {
    constexpr Activation A = decltype(a)::value;
    const float beta = act.beta;
    // Local copies: the lambda's by-reference captures would reach the loop as shared
    // references, and GCC 12 then vectorises the loads and stores as gathers and scatters.
    const float* xs = x;
    float* ys = y;
#pragma omp parallel for simd schedule(static) if (n > kernels::kParallelGrain)
    for (std::int64_t i = 0; i < n; ++i) ys[i] = kernels::act_value<A>(xs[i], beta);
  });
}

void activation_backward(float* dx, const float* dy, const float* x, std::int64_t n, Act act) {
  kernels::dispatch(act.kind, [&](auto a) {
    constexpr Activation A = decltype(a)::value;
    const float beta = act.beta;
    const float *xs = x, *dys = dy;  // local copies, as in activation_forward
    float* dxs = dx;
#pragma omp parallel for simd schedule(static) if (n > kernels::kParallelGrain)
    for (std::int64_t i = 0; i < n; ++i) dxs[i] = kernels::grad_times<A>(dys[i], xs[i], beta);
  });
}

bool derivative_from_output(Act act) {
  return kernels::has_grad_from_output(act.kind);
}

void activation_backward_from_output(float* dx, const float* dy, const float* y, std::int64_t n,
                                     Act act) {
  check(derivative_from_output(act),
        "[activation] the derivative of {} is not a function of its output", enum_name(act.kind));
  kernels::dispatch(act.kind, [&](auto a) {
    constexpr Activation A = decltype(a)::value;
    if constexpr (kernels::has_grad_from_output(A)) {
      const float *ys = y, *dys = dy;  // local copies, as in activation_forward
      float* dxs = dx;
#pragma omp parallel for simd schedule(static) if (n > kernels::kParallelGrain)
      for (std::int64_t i = 0; i < n; ++i)
        dxs[i] = kernels::grad_times_from_output<A>(dys[i], ys[i]);
    }
  });
}

double zero_fraction(const float* x, std::int64_t n) {
  std::int64_t zeros = 0;
#pragma omp parallel for simd reduction(+ : zeros) if (n > kernels::kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) zeros += x[i] == 0.0f;
  return n > 0 ? static_cast<double>(zeros) / static_cast<double>(n) : 0.0;
}

void activation_forward(Tensor& y, const Tensor& x, Act act) {
  check(y.numel() == x.numel(), "[activation] output has {} elements, input {}", y.numel(),
        x.numel());
  activation_forward(y.f32(), x.f32(), x.numel(), act);
}

void activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Act act) {
  check(dx.numel() == x.numel() && dy.numel() == x.numel(),
        "[activation] backward sizes differ: dx {}, dy {}, x {}", dx.numel(), dy.numel(),
        x.numel());
  activation_backward(dx.f32(), dy.f32(), x.f32(), x.numel(), act);
}

void activation_backward_from_output(Tensor& dx, const Tensor& dy, const Tensor& y, Act act) {
  check(dx.numel() == y.numel() && dy.numel() == y.numel(),
        "[activation] backward sizes differ: dx {}, dy {}, y {}", dx.numel(), dy.numel(),
        y.numel());
  activation_backward_from_output(dx.f32(), dy.f32(), y.f32(), y.numel(), act);
}

}  // namespace ffnlab
