// Vectorisable elementwise kernels: the activations and their derivatives, exp, and the
// exponentials of a softmax row (attention, cross-entropy). Every function here is branch-free
// arithmetic that GCC and clang turn into SIMD code inside `#pragma omp simd` loops; the standard
// library's expf/erff are not, without -ffast-math (which this project does not use). More
// things stop GCC 12 from vectorising such a loop, silently (the loop stays scalar and correct):
// std::min/std::max (their reference arguments become per-lane arrays under `omp simd`), hence
// the ternaries; the ternaries themselves on AVX2 unless the build has -fno-trapping-math (it
// does, CMakeLists.txt); a product with a 0/1 factor (grad_times). `bench_kernels` and
// `-fopt-info-vec` show the difference; check both after touching a kernel. Accuracy against the
// double reference: a few float ulps for exp, ~2e-7 absolute for erf and tanh (see
// test_activation.cpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ffnlab/error.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/dispatch.hpp"

namespace ffnlab::kernels {

// a·b + c, fused where the target has an FMA instruction. Without one (a portable x86-64
// build), std::fma is a call into libm per element that no loop vectorises, so the plain
// multiply-add is used instead: it rounds twice, and the kernels' accuracy bounds hold either
// way (docs/benchmarks.md, "Portable builds").
inline float mul_add(float a, float b, float c) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// x clamped to [lo, hi]; NaN stays NaN, as with std::min/std::max.
inline float clamp_lanes(float x, float lo, float hi) {
  x = x < lo ? lo : x;
  return hi < x ? hi : x;
}
// max(x, 0); NaN stays NaN, as with std::max(x, 0.0f).
inline float relu_lanes(float x) {
  return x < 0.0f ? 0.0f : x;
}

// e^x: Cody–Waite reduction x = n·ln2 + r, |r| <= ln2/2, then a degree-7 Taylor polynomial.
// n = round(x·log2 e): adding 1.5·2^23 leaves no fraction bits, so the sum is rounded to an
// integer (to nearest, ties to even), and subtracting it again gives that integer exactly.
inline float exp_fast(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5·2^23
  x = clamp_lanes(x, -87.0f, 88.0f);
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = mul_add(n, -0.693359375f, x);
  r = mul_add(n, 2.12194440e-4f, r);
  float p = 1.0f / 5040.0f;
  p = mul_add(p, r, 1.0f / 720.0f);
  p = mul_add(p, r, 1.0f / 120.0f);
  p = mul_add(p, r, 1.0f / 24.0f);
  p = mul_add(p, r, 1.0f / 6.0f);
  p = mul_add(p, r, 0.5f);
  p = mul_add(p, r, 1.0f);
  p = mul_add(p, r, 1.0f);
  // A NaN x (a diverged run) keeps p NaN; n is then no integer, and converting it would be
  // undefined behaviour (UBSan caught it), so the exponent takes 0 instead.
  const std::int32_t bits = (static_cast<std::int32_t>(n == n ? n : 0.0f) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

inline float sigmoid_fast(float x) {
  return 1.0f / (1.0f + exp_fast(-x));
}

// σ(z) and 1 − σ(z) = e^{−z}·σ(z), the latter without the cancellation of 1 − s when s ≈ 1.
struct SigmoidPair {
  float s, one_minus_s;
};
inline SigmoidPair sigmoid_pair(float z) {
  const float e = exp_fast(-z);
  const float s = 1.0f / (1.0f + e);
  return {s, e * s};
}

inline float tanh_fast(float x) {
  return 1.0f - 2.0f / (exp_fast(2.0f * x) + 1.0f);
}

// erf(x) by Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7), given e = e^{−x²}: GELU's
// derivative needs that exponential as well (gelu_value_grad).
inline float erf_given_exp(float x, float e) {
  const float a = std::fabs(x);
  const float t = 1.0f / mul_add(0.3275911f, a, 1.0f);
  float p = 1.061405429f;
  p = mul_add(p, t, -1.453152027f);
  p = mul_add(p, t, 1.421413741f);
  p = mul_add(p, t, -0.284496736f);
  p = mul_add(p, t, 0.254829592f);
  return std::copysign(1.0f - p * t * e, x);
}

inline float erf_fast(float x) {
  return erf_given_exp(x, exp_fast(-x * x));
}

// max_j in[j] (n >= 1). A max reduction in lanes of 16: clang 14 vectorises no floating-point
// max reduction without -ffast-math (not even under `omp simd reduction(max)`), GCC does both.
inline float max_of(const float* in, std::int64_t n) {
  constexpr int W = 16;
  float lanes[W];
  for (int l = 0; l < W; ++l) lanes[l] = in[0];
  std::int64_t j = 0;
  for (; j + W <= n; j += W)
#pragma omp simd
    for (int l = 0; l < W; ++l) lanes[l] = in[j + l] > lanes[l] ? in[j + l] : lanes[l];
  float mx = in[0];
  for (; j < n; ++j) mx = in[j] > mx ? in[j] : mx;
  for (int l = 0; l < W; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
  return mx;
}

// The exponentials of a softmax row: out[j] = e^(in[j] − m) for j < n, m = max_j in[j]; returns
// their sum and stores m in *max_out. in may equal out. Both loops vectorise (see the top).
inline float exp_minus_max(float* out, const float* in, std::int64_t n, float* max_out) {
  const float mx = max_of(in, n);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t j = 0; j < n; ++j) {
    out[j] = exp_fast(in[j] - mx);
    sum += out[j];
  }
  *max_out = mx;
  return sum;
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// GELU's value x·Φ(x) and derivative Φ(x) + x·φ(x), Φ(x) = (1 + erf(x/√2))/2. One exponential
// serves both: e^{−(x/√2)²} is erf's factor and √(2π)·φ(x).
struct ValueGrad {
  float value, grad;
};
inline ValueGrad gelu_value_grad(float x) {
  const float z = x * kInvSqrt2;
  const float e = exp_fast(-z * z);
  const float erf = erf_given_exp(z, e);
  return {0.5f * x * (1.0f + erf), 0.5f * (1.0f + erf) + x * kInvSqrt2Pi * e};
}

// The activations whose value and derivative share their costly part (an erf, a sigmoid): the
// backward of a gated product needs both, and computing them apart doubled its exponentials and
// divisions (`bench_kernels --benchmark_filter=Glu`). For the sigmoid-based ones the pair is
// the same values as act_value and act_grad, bit for bit.
constexpr bool has_value_grad(Activation a) {
  return a == Activation::gelu || a == Activation::gelu_tanh || a == Activation::gelu_quick ||
         a == Activation::silu;
}

template <Activation A>
inline ValueGrad value_grad(float x, float beta) {
  static_assert(has_value_grad(A));
  if constexpr (A == Activation::gelu)
    return gelu_value_grad(x);
  else if constexpr (A == Activation::gelu_tanh) {  // d/dx x·σ(2u) = σ + 2x·σ·(1−σ)·u'
    const auto p = sigmoid_pair(2.0f * kSqrt2OverPi * (x + 0.044715f * x * x * x));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
    return {x * p.s, p.s + 2.0f * x * p.s * p.one_minus_s * du};
  } else if constexpr (A == Activation::gelu_quick) {
    const auto p = sigmoid_pair(1.702f * x);
    return {x * p.s, p.s + 1.702f * x * p.s * p.one_minus_s};
  } else {
    static_assert(A == Activation::silu, "value_grad: a branch for each has_value_grad lists");
    const auto p = sigmoid_pair(beta * x);
    return {x * p.s, p.s + beta * x * p.s * p.one_minus_s};
  }
}

template <Activation A>
inline float act_value(float x, float beta) {
  if constexpr (A == Activation::relu)
    return relu_lanes(x);
  else if constexpr (A == Activation::gelu)
    return 0.5f * x * (1.0f + erf_fast(x * kInvSqrt2));
  // 0.5·(1 + tanh(u)) = σ(2u): the same function, without cancellation in the negative tail.
  else if constexpr (A == Activation::gelu_tanh)
    return x * sigmoid_fast(2.0f * kSqrt2OverPi * (x + 0.044715f * x * x * x));
  else if constexpr (A == Activation::gelu_quick)
    return x * sigmoid_fast(1.702f * x);
  else if constexpr (A == Activation::silu)
    return x * sigmoid_fast(beta * x);
  else if constexpr (A == Activation::sigmoid)
    return sigmoid_fast(x);
  else if constexpr (A == Activation::tanh)
    return tanh_fast(x);
  else if constexpr (A == Activation::relu2) {
    const float r = relu_lanes(x);
    return r * r;
  } else if constexpr (A == Activation::identity)
    return x;
  else
    static_assert(A != A, "a new activation needs its formula here");
}

template <Activation A>
inline float act_grad(float x, float beta) {
  if constexpr (A == Activation::relu)
    return x > 0.0f ? 1.0f : 0.0f;
  else if constexpr (has_value_grad(A))
    return value_grad<A>(x, beta).grad;
  else if constexpr (A == Activation::sigmoid) {
    const auto p = sigmoid_pair(x);
    return p.s * p.one_minus_s;
  } else if constexpr (A == Activation::tanh) {  // 1 − tanh² = 4·σ(2x)·(1 − σ(2x)), no cancellation
    const auto p = sigmoid_pair(2.0f * x);
    return 4.0f * p.s * p.one_minus_s;
  } else if constexpr (A == Activation::relu2)
    return 2.0f * relu_lanes(x);
  else if constexpr (A == Activation::identity)
    return 1.0f;
  else
    static_assert(A != A, "a new activation needs its formula here");
}

// dy · act'(x), what every backward computes. ReLU's is a select, x > 0 ? dy : 0 (PyTorch's
// threshold_backward): GCC 12 vectorises the select, but turns the product with a 0/1 factor
// into a branch and leaves the loop scalar (docs/benchmarks.md, "Elementwise kernels and
// compiler flags").
template <Activation A>
inline float grad_times(float dy, float x, float beta) {
  if constexpr (A == Activation::relu)
    return x > 0.0f ? dy : 0.0f;
  else
    return dy * act_grad<A>(x, beta);
}

// dy · act'(x) from the output y = act(x), for the activations whose derivative is a function
// of their output (has_grad_from_output): a layer that uses it keeps y only, not x.
constexpr bool has_grad_from_output(Activation a) {
  return a == Activation::relu || a == Activation::sigmoid || a == Activation::tanh;
}

template <Activation A>
inline float grad_times_from_output(float dy, float y) {
  static_assert(has_grad_from_output(A));
  if constexpr (A == Activation::relu)
    return y > 0.0f ? dy : 0.0f;  // y > 0 exactly where x > 0
  else if constexpr (A == Activation::sigmoid)
    return dy * (y * (1.0f - y));
  else {
    static_assert(A == Activation::tanh,
                  "has_grad_from_output names an activation whose formula is not written here");
    return dy * (1.0f - y * y);
  }
}

// Calls f(std::integral_constant<Activation, A>{}) for the runtime value `act`, so that the
// switch sits outside the loops and each loop is compiled for one activation.
template <typename F>
void dispatch(Activation act, F&& f) {
  using A = Activation;
  switch (act) {
    case A::relu:
      return f(std::integral_constant<A, A::relu>{});
    case A::gelu:
      return f(std::integral_constant<A, A::gelu>{});
    case A::gelu_tanh:
      return f(std::integral_constant<A, A::gelu_tanh>{});
    case A::gelu_quick:
      return f(std::integral_constant<A, A::gelu_quick>{});
    case A::silu:
      return f(std::integral_constant<A, A::silu>{});
    case A::sigmoid:
      return f(std::integral_constant<A, A::sigmoid>{});
    case A::tanh:
      return f(std::integral_constant<A, A::tanh>{});
    case A::relu2:
      return f(std::integral_constant<A, A::relu2>{});
    case A::identity:
      return f(std::integral_constant<A, A::identity>{});
    case A::count:
      break;
  }
  throw Error("[activation] invalid activation value " + std::to_string(static_cast<int>(act)));
}

// Elements per OpenMP chunk: large enough that a thread's work dwarfs the fork cost.
constexpr std::int64_t kParallelGrain = dispatch::kElementwiseGrain;

}  // namespace ffnlab::kernels
