// Scalar reference for the activations, in any floating type (double for gradient checks).
// Written for clarity with the standard library's exact functions; the fast kernels are tested
// against it.
#pragma once

#include <cmath>
#include <cstdint>

#include "ffnlab/ops/activation.hpp"

namespace ffnlab::ref {

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <typename T>
T activation(Activation act, T x, T beta = T(1)) {
  const T kSqrt2OverPi = T(0.7978845608028654);
  switch (act) {
    case Activation::relu:
      return x > T(0) ? x : T(0);
    case Activation::gelu:
      return T(0.5) * x * (T(1) + std::erf(x / std::sqrt(T(2))));
    case Activation::gelu_tanh:
      return T(0.5) * x * (T(1) + std::tanh(kSqrt2OverPi * (x + T(0.044715) * x * x * x)));
    case Activation::gelu_quick:
      return x * sigmoid(T(1.702) * x);
    case Activation::silu:
      return x * sigmoid(beta * x);
    case Activation::sigmoid:
      return sigmoid(x);
    case Activation::tanh:
      return std::tanh(x);
    case Activation::relu2:
      return x > T(0) ? x * x : T(0);
    case Activation::identity:
      return x;
    case Activation::count:
      break;
  }
  return T(0);
}

// d act(x) / dx.
template <typename T>
T activation_grad(Activation act, T x, T beta = T(1)) {
  const T kSqrt2OverPi = T(0.7978845608028654);
  switch (act) {
    case Activation::relu:
      return x > T(0) ? T(1) : T(0);
    case Activation::gelu: {
      const T cdf = T(0.5) * (T(1) + std::erf(x / std::sqrt(T(2))));
      const T pdf = std::exp(T(-0.5) * x * x) / std::sqrt(T(2) * T(M_PI));
      return cdf + x * pdf;
    }
    case Activation::gelu_tanh: {
      const T u = kSqrt2OverPi * (x + T(0.044715) * x * x * x);
      const T t = std::tanh(u);
      const T du = kSqrt2OverPi * (T(1) + T(3) * T(0.044715) * x * x);
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
    }
    case Activation::gelu_quick: {
      const T s = sigmoid(T(1.702) * x);
      return s + T(1.702) * x * s * (T(1) - s);
    }
    case Activation::silu: {
      const T s = sigmoid(beta * x);
      return s + beta * x * s * (T(1) - s);
    }
    case Activation::sigmoid: {
      const T s = sigmoid(x);
      return s * (T(1) - s);
    }
    case Activation::tanh: {
      const T t = std::tanh(x);
      return T(1) - t * t;
    }
    case Activation::relu2:
      return x > T(0) ? T(2) * x : T(0);
    case Activation::identity:
      return T(1);
    case Activation::count:
      break;
  }
  return T(0);
}

template <typename T>
void activation_forward(T* y, const T* x, std::int64_t n, Act act) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = activation<T>(act.kind, x[i], T(act.beta));
}

template <typename T>
void activation_backward(T* dx, const T* dy, const T* x, std::int64_t n, Act act) {
  for (std::int64_t i = 0; i < n; ++i)
    dx[i] = dy[i] * activation_grad<T>(act.kind, x[i], T(act.beta));
}

}  // namespace ffnlab::ref
