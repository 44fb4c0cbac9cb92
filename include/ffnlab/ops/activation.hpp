// Elementwise activation functions: forward and backward over whole tensors.
// The scalar reference is ops/ref/activation_ref.hpp; the vectorised kernels are
// src/ops/activation_kernels.hpp; the tests are tests/unit/test_activation.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/names.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab {

// The closed set of activations. Adding one starts with this enum and its name row below;
// CONTRIBUTING.md, "How to add an activation", lists every place it touches, and which of them
// nothing checks.
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

// Canonical names in enum order, then aliases (Hugging Face's ACT2FN names among them).
template <>
struct EnumNames<Activation> {
  static constexpr auto table =
      name_table<Activation>("activation", "activation",
                             {{Activation::relu, "relu"},
                              {Activation::gelu, "gelu"},
                              {Activation::gelu_tanh, "gelu_tanh"},
                              {Activation::gelu_quick, "gelu_quick"},
                              {Activation::silu, "silu"},
                              {Activation::sigmoid, "sigmoid"},
                              {Activation::tanh, "tanh"},
                              {Activation::relu2, "relu2"},
                              {Activation::identity, "identity"},
                              {Activation::silu, "swish"},
                              {Activation::gelu, "gelu_erf"},
                              {Activation::gelu_tanh, "gelu_new"},
                              {Activation::gelu_tanh, "gelu_pytorch_tanh"},
                              {Activation::gelu_quick, "quick_gelu"},
                              {Activation::relu2, "relu_squared"},
                              {Activation::identity, "linear"}});
};
static_assert(EnumNames<Activation>::table.complete(), "every activation needs a name row");

// y = act(x), elementwise. y and x have the same number of elements; y may alias x.
void activation_forward(Tensor& y, const Tensor& x, Act act);
// dx = dy · act'(x), elementwise; overwrites dx. x is the saved forward input.
void activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Act act);

// Whether act'(x) is a function of act(x): ReLU (y > 0), sigmoid (y·(1 − y)), tanh (1 − y²).
// A layer can then apply the activation as its product's epilogue and keep only the output.
bool derivative_from_output(Act act);
// dx = dy · act'(x) computed from y = act(x); overwrites dx. Only where derivative_from_output.
void activation_backward_from_output(Tensor& dx, const Tensor& dy, const Tensor& y, Act act);

// The fraction of the n elements of x that are exactly zero (activation sparsity).
double zero_fraction(const float* x, std::int64_t n);

// Raw-array forms, used by layers on parts of their workspaces (n elements each).
void activation_forward(float* y, const float* x, std::int64_t n, Act act);
void activation_backward(float* dx, const float* dy, const float* x, std::int64_t n, Act act);
void activation_backward_from_output(float* dx, const float* dy, const float* y, std::int64_t n,
                                     Act act);

}  // namespace ffnlab
