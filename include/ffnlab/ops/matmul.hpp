// Matrix products through oneDNN: C = op(A)·op(B) (+ bias) (then act), or C += op(A)·op(B).
// Primitives are created once per shape/option set and kept in a process-wide cache.
#pragma once

#include <cstdint>
#include <memory>

#include "ffnlab/ops/activation.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab {

// Compute precision of a product's inputs; accumulation and output are always f32.
enum class Precision : std::uint8_t { f32, bf16, count };
template <>
struct EnumNames<Precision> {
  static constexpr auto table = name_table<Precision>("precision", "dtype",
                                                      {{Precision::f32, "f32"},
                                                       {Precision::bf16, "bf16"},
                                                       {Precision::f32, "float32"},
                                                       {Precision::bf16, "bfloat16"}});
};
static_assert(EnumNames<Precision>::table.complete());

// How a row-major operand is read: as stored, or transposed (by strides; nothing is copied).
enum class Trans : std::uint8_t { no, yes };

struct MatmulOptions {
  const Tensor* bias = nullptr;  // [N], added to every row of C
  const Act* act = nullptr;      // activation applied to C after the bias (oneDNN post-op)
  bool accumulate = false;       // C += product instead of C = product
  Precision precision = Precision::f32;
  // M (K) changes from call to call, as the token count of an MoE expert block does: one
  // primitive with a run-time dimension then serves every value, instead of a new primitive
  // (milliseconds to create) per value. bench/bench_matmul measures both: a run-time K runs at
  // the fixed rate, a run-time M slower at a few hundred rows, so linear_forward splits varying
  // rows into a few fixed shapes instead, and up to kFewRowsMax rows chooses by the rows
  // and the weight's size (ops/dispatch.hpp; docs/benchmarks.md has the numbers).
  bool dynamic_m = false;
  bool dynamic_k = false;
};

// c [M, N] = op(a) [M, K] · op(b) [K, N]. Shapes are checked; tensors are contiguous, c is f32,
// a and b are f32, or bf16 in a bf16 product (then read as stored, without a conversion).
// Batched: c [G, M, N] = op(a) [G, M, K] · op(b) [G, K, N], G independent products (attention's
// per-head products); op transposes the last two dimensions. No bias then.
void matmul(Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
            const MatmulOptions& options = {});

// A product's second operand (a layer's weight) in the layout oneDNN chooses for one product:
// c [M, N] = a [M, K] · op(b) with a given M and options. oneDNN reads it faster than the plain
// layout at many rows (bench/bench_packed; docs/benchmarks.md); packing is a reorder (and the
// conversion, for a bf16 product), paid once for every product that reads the packed copy. Layers
// pack their weights once per training forward (ops/linear.hpp, packs_weights). The copy belongs to
// this object; moving it is cheap, copying it shares it until either packs again (which then packs
// into memory of its own). Not to be confused with the bf16 inference weights
// (FeedForward::set_inference_weights), a plain bf16 copy.
class PackedWeights {
 public:
  // Packs b (f32, or bf16 for a bf16 product) for matmul(c, a, *this, options) with a [M, K],
  // op(b) = b or bᵀ. A bf16 product needs native bf16 products (matmul_bf16_native); run-time
  // dimensions are not supported.
  void pack(const Tensor& b, Trans tb, std::int64_t M, const MatmulOptions& options);
  bool packed() const { return state_ != nullptr; }
  // Forget the packed copy (its memory is freed once no product holds it).
  void reset() { state_.reset(); }

  struct State;  // oneDNN's memory, the reorder and the product it was packed for

 private:
  friend void matmul(Tensor& c, const Tensor& a, const PackedWeights& b,
                     const MatmulOptions& options);
  std::shared_ptr<State> state_;
};

// c [M, N] = a [M, K] · op(b) (+ bias) (then act), b packed for exactly this product (its M,
// options and precision; anything else is an error). a is f32 or, in a bf16 product, bf16.
void matmul(Tensor& c, const Tensor& a, const PackedWeights& b, const MatmulOptions& options = {});

// Whether oneDNN computes bf16 products natively on this CPU (AVX-512 or AMX). Where it does not
// (an AVX2 CPU), a bf16 product is emulated: f32 products of the bf16-rounded inputs, the same
// values (bf16 products are exact in f32, accumulation is f32 either way) at f32's speed.
bool matmul_bf16_native();

// Whether oneDNN's f32 products are 512-bit here: whether the instruction set oneDNN runs with
// (the CPU's, capped by ONEDNN_MAX_CPU_ISA) is an AVX-512 one. Weight packing and the few-row
// kernels' limits on wide weights were measured against such products (ops/dispatch.hpp).
bool matmul_f32_512_bit();

// Rows from which an f32 product c = a · op(b) (a read as stored, not batched, fixed shapes) runs
// as oneDNN's 1x1 convolution, b reordered into its layout on each call: dispatch::kConvMinRows
// where oneDNN's f32 products are not 512-bit, never (0) elsewhere. The same product either way
// up to the order of its sums. set_matmul_conv_min_rows changes it (0 or less: never), for
// benchmarks that compare the two paths; a changed setting changes the last bits of results.
std::int64_t matmul_conv_min_rows();
void set_matmul_conv_min_rows(std::int64_t rows);

// Number of products run as a convolution in this process (for the tests of that path).
std::int64_t matmul_conv_products();

// Number of PackedWeights::pack calls in this process (for the tests of the layers that pack).
std::int64_t matmul_packings();

// Number of primitives in the cache (for its tests). It holds at most 1024; past that it is
// emptied and refilled, so that ever new shapes cannot grow memory without bound.
std::int64_t matmul_primitive_count();

}  // namespace ffnlab
