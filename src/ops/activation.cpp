// Activation forward/backward over tensors: name table, argument checks, parallel loops.
#include "ffnlab/ops/activation.hpp"

#include <array>

#include "activation_kernels.hpp"
#include "check.hpp"

namespace ffnlab {

namespace {

struct NameEntry {
  Activation act;
  const char* name;
};
// The canonical name first; aliases after. Printing uses the first entry of each activation.
constexpr std::array kActivationNames{
    NameEntry{Activation::relu, "relu"},
    NameEntry{Activation::gelu, "gelu"},
    NameEntry{Activation::gelu_tanh, "gelu_tanh"},
    NameEntry{Activation::gelu_quick, "gelu_quick"},
    NameEntry{Activation::silu, "silu"},
    NameEntry{Activation::sigmoid, "sigmoid"},
    NameEntry{Activation::tanh, "tanh"},
    NameEntry{Activation::relu2, "relu2"},
    NameEntry{Activation::identity, "identity"},
    // aliases (Hugging Face's ACT2FN names among them)
    NameEntry{Activation::silu, "swish"},
    NameEntry{Activation::gelu, "gelu_erf"},
    NameEntry{Activation::gelu_tanh, "gelu_new"},
    NameEntry{Activation::gelu_tanh, "gelu_pytorch_tanh"},
    NameEntry{Activation::gelu_quick, "quick_gelu"},
    NameEntry{Activation::relu2, "relu_squared"},
    NameEntry{Activation::identity, "linear"},
};
static_assert(static_cast<int>(Activation::count) == 9,
              "a new activation needs a row in kActivationNames");

}  // namespace

const char* activation_name(Activation act) {
  for (const auto& e : kActivationNames)
    if (e.act == act) return e.name;
  return "?";
}

Activation parse_activation(std::string_view name) {
  for (const auto& e : kActivationNames)
    if (name == e.name) return e.act;
  std::string known;
  for (const auto& e : kActivationNames) known += (known.empty() ? "" : ", ") + std::string(e.name);
  fail("[activation] unknown activation '{}' (known: {})", name, known);
}

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
    for (std::int64_t i = 0; i < n; ++i) dxs[i] = dys[i] * kernels::act_grad<A>(xs[i], beta);
  });
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

}  // namespace ffnlab
