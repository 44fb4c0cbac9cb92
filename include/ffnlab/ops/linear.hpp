// Linear (fully connected) op: y = x·Wᵀ + b with W stored like torch.nn.Linear.weight, [O, I].
// Products go through ops/matmul (oneDNN), f32 products of a few rows through ops/few_rows (they
// stream the weights once; few_rows_f32_max says how few); the scalar reference is
// ops/ref/linear_ref.hpp.
#pragma once

#include "ffnlab/ops/matmul.hpp"

namespace ffnlab {

// y [T, O] = x [T, I] · w [O, I]ᵀ + b [O] (b may be null); act, if given, is fused into the
// product as a oneDNN post-op (inference: the pre-activation is not kept).
// varying_rows: T changes from call to call (an MoE's expert blocks): the product runs as a few
// fixed-shape parts (the rows rounded down to a multiple of a quantum that grows with T, then the
// rest), so a run creates few primitives; up to kFewRowsMax rows, one run-time-dimension
// primitive or a fixed shape per T, whichever is faster for the weight's size (ops/dispatch.hpp).
// packed: w (the f32 master weight) is packed into it for this product and the product reads
// the packed copy (a layer's own PackedWeights, kept to the next call so the packed memory is
// reused); the caller decides, with packs_weights (ProductOperands does). Not with varying rows.
void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b,
                    Precision precision = Precision::f32, const Act* act = nullptr,
                    bool varying_rows = false, PackedWeights* packed = nullptr);

// dx [T, I] = dy · w        (overwritten; skipped when dx is null)
// dw [O, I] += dyᵀ · x      (accumulated)
// db [O]    += Σ_t dy[t]    (accumulated; skipped when db is null)
// packed: as linear_forward's, for the dx product (another layout than the forward's).
void linear_backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, Precision precision = Precision::f32,
                     bool varying_rows = false, PackedWeights* packed = nullptr);

// Whether a training product of M rows reads its weight packed (PackedWeights, packed once per
// forward for the forward's product and once for the backward's dx product): from
// weight_packing_min_rows() rows (by default dispatch::kPackingMinRows where oneDNN's products
// are 512-bit, matmul_f32_512_bit, where whole layers run faster packed; never elsewhere), in
// f32 and in native bf16 products (converts_operands_once).
bool packs_weights(std::int64_t M, Precision precision);
std::int64_t weight_packing_min_rows();
// For benchmarks and tests: rows from which products pack (<= 0: never).
void set_weight_packing_min_rows(std::int64_t rows);

// Whether a layer converts the tensors its bf16 products share once, for all of them (x: the
// forward's and dW's product; a weight: the forward's and dx's; a gradient: dW's and dx's):
// for bf16 products on a CPU that computes them natively. Where they are emulated
// (matmul_bf16_native), matmul widens a bf16 operand to f32 on every call, so a layer hands
// it the f32 tensors instead; f32 products read them as they are.
bool converts_operands_once(Precision precision);

// out = t rounded to bf16 as matmul rounds an f32 operand (t copied when it is bf16 already),
// for the products that share it to read. Returns out.
const Tensor& product_operand(Tensor& out, const Tensor& t);

// One weight as a layer's training products read it (ProductOperands): a bf16 copy made once per
// forward, or, at many rows (packs_weights), packed for the forward's product and for the
// backward's dx product, the packing doing the conversion. The layer owns it, so the buffers
// are reused from step to step.
struct ProductWeight {
  Tensor bf16;
  PackedWeights forward, dx;
};

// What a layer's products read, as its training forward decided: with converts_operands_once,
// bf16 copies the forward makes (into buffers the layer owns) and its backward reads again;
// otherwise the tensors themselves. Weights: packed instead where packs_weights (f32 too).
// One per layer; the layer owns the copies' buffers.
class ProductOperands {
 public:
  // At the start of a forward: whether this one makes bf16 copies (train, native bf16) and whether
  // it packs its weights (train, packs_weights(rows, precision); rows 0: never, as for an MoE's
  // expert blocks, whose rows vary).
  void start(bool train, Precision precision, std::int64_t rows = 0);
  // In the forward: t's operand, converted into `copy` when it makes copies.
  const Tensor& operator()(Tensor& copy, const Tensor& t) const {
    return copies_ ? product_operand(copy, t) : t;
  }
  // In the backward: what the forward's product read (`copy` if it made one, else t).
  const Tensor& saved(const Tensor& copy, const Tensor& t) const { return copies_ ? copy : t; }
  // In the backward: gradient g's operand for its two products, converted once into the
  // calling thread's Scratch::grad_bf16 when it makes copies (valid until the next gradient's).
  const Tensor& gradient(const Tensor& g) const;
  // The backward's check that the precision is still the forward's; `layer` names the layer in
  // the message ("[ffn]").
  void check_unchanged(Precision now, const char* layer) const;
  bool copies() const { return copies_; }

  // Weight w's operand for the forward's product, and where linear_forward packs it (null: not
  // packed): the master weight and k.forward when packing, else k.bf16 or w as operator().
  // What this forward does not use is freed (the packed weights in inference, say).
  const Tensor& weight(ProductWeight& k, const Tensor& w) const;
  PackedWeights* forward_packing(ProductWeight& k) const { return packs_ ? &k.forward : nullptr; }
  // The same for the backward's dx product (linear_backward packs into k.dx).
  const Tensor& saved_weight(const ProductWeight& k, const Tensor& w) const {
    return packs_ ? w : saved(k.bf16, w);
  }
  PackedWeights* dx_packing(ProductWeight& k) const { return packs_ ? &k.dx : nullptr; }

 private:
  bool copies_ = false;  // this forward converts its operands into bf16 copies
  bool packs_ = false;
  Precision precision_ = Precision::f32;
};

// db [O] += Σ_t dy[t, :], in a fixed order (deterministic for any thread count).
void bias_backward(Tensor& db, const Tensor& dy);

}  // namespace ffnlab
