// Linear (fully connected) op: y = x·Wᵀ + b with W stored like torch.nn.Linear.weight, [O, I].
// Products go through ops/matmul (oneDNN), f32 products of a few rows through ops/skinny (they
// stream the weights once; skinny_f32_max_rows says how few); the scalar reference is
// ops/ref/linear_ref.hpp.
#pragma once

#include "ffnlab/ops/matmul.hpp"

namespace ffnlab {

// y [T, O] = x [T, I] · w [O, I]ᵀ + b [O] (b may be null); act, if given, is fused into the
// product as a oneDNN post-op (inference: the pre-activation is not kept).
// varying_rows: T changes from call to call (an MoE's expert blocks): the product runs as a few
// fixed-shape parts (the rows rounded down to a multiple of max(16, 2^⌊log2 T⌋/8), then the
// rest), so a run creates few primitives; up to 8 rows, one run-time-dimension primitive or a
// fixed shape per T, whichever measured faster for the weight's size.
void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b,
                    Precision precision = Precision::f32, const Act* act = nullptr,
                    bool varying_rows = false);

// dx [T, I] = dy · w        (overwritten; skipped when dx is null)
// dw [O, I] += dyᵀ · x      (accumulated)
// db [O]    += Σ_t dy[t]    (accumulated; skipped when db is null)
void linear_backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, Precision precision = Precision::f32,
                     bool varying_rows = false);

// Whether a layer converts the tensors its bf16 products share once, for all of them (x: the
// forward's and dW's product; a weight: the forward's and dx's; a gradient: dW's and dx's):
// for bf16 products on a CPU that computes them natively. Where they are emulated
// (matmul_bf16_native), matmul widens a bf16 operand to f32 on every call, so a layer hands
// it the f32 tensors instead; f32 products read them as they are.
bool converts_operands_once(Precision precision);

// out = t rounded to bf16 as matmul rounds an f32 operand (t copied when it is bf16 already),
// for the products that share it to read. Returns out.
const Tensor& product_operand(Tensor& out, const Tensor& t);

// What a layer's products read, as its training forward decided: with converts_operands_once,
// bf16 copies the forward makes (into buffers the layer owns) and its backward reads again;
// otherwise the tensors themselves. One per layer; the layer keeps the copies' buffers.
class KeptOperands {
 public:
  // At the start of a forward: whether this one keeps copies (train, native bf16).
  void start(bool train, Precision precision);
  // In the forward: t's operand, converted into `copy` when keeping.
  const Tensor& operator()(Tensor& copy, const Tensor& t) const {
    return kept_ ? product_operand(copy, t) : t;
  }
  // In the backward: what the forward's product read (`copy` if it kept one, else t).
  const Tensor& saved(const Tensor& copy, const Tensor& t) const { return kept_ ? copy : t; }
  // In the backward: gradient g's operand for its two products, converted once into the
  // calling thread's Scratch::grad_bf16 when keeping (valid until the next gradient's).
  const Tensor& gradient(const Tensor& g) const;
  // The backward's check that the precision is still the forward's; `layer` names the layer in
  // the message ("[ffn]").
  void check_unchanged(Precision now, const char* layer) const;
  bool kept() const { return kept_; }

 private:
  bool kept_ = false;
  Precision precision_ = Precision::f32;
};

// db [O] += Σ_t dy[t, :], in a fixed order (deterministic for any thread count).
void bias_backward(Tensor& db, const Tensor& dy);

}  // namespace ffnlab
