// Elementwise activation functions: forward and backward over whole tensors.
// The scalar reference is ops/ref/activation_ref.hpp; the vectorised kernels are
// src/ops/activation_kernels.hpp; the tests are tests/unit/test_activation.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

// The closed set of activations. Adding one touches: this enum, kActivationNames in
// src/ops/activation.cpp, the kernels, the reference, the oneDNN post-op map in
// src/ops/matmul.cpp, and the PyTorch table in tests/parity/make_golden.py.
enum class Activation : std::uint8_t {
  relu,        // max(0, x)
  gelu,        // x·Φ(x), with the exact erf (PyTorch's default)
  gelu_tanh,   // the tanh approximation of GELU (GPT-2's "gelu_new")
  gelu_quick,  // x·σ(1.702·x)
  silu,        // x·σ(β·x): SiLU for β = 1, Swish-β otherwise
  sigmoid,     // σ(x)
  tanh,        // tanh(x)
  relu2,       // max(0, x)² (Primer, Nemotron)
  identity,    // x (the "bilinear" GLU)
  count
};

// An activation with its parameter (β is used by silu only).
struct Act {
  Activation kind = Activation::relu;
  float beta = 1.0f;
};

const char* activation_name(Activation act);
// Accepts ffnlab's names and the common aliases (swish, gelu_erf, gelu_new, gelu_pytorch_tanh,
// quick_gelu, relu_squared, linear). Throws "[activation] unknown activation 'x' (known: ...)".
Activation parse_activation(std::string_view name);

// y = act(x), elementwise. y and x have the same number of elements; y may alias x.
void activation_forward(Tensor& y, const Tensor& x, Act act);
// dx = dy · act'(x), elementwise; overwrites dx. x is the saved forward input.
void activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Act act);

// Raw-array forms, used by layers on parts of their workspaces (n elements each).
void activation_forward(float* y, const float* x, std::int64_t n, Act act);
void activation_backward(float* dx, const float* dy, const float* x, std::int64_t n, Act act);

}  // namespace ffnlab
