// Linear forward/backward on top of the oneDNN matmul wrapper.
#include "ffnlab/ops/linear.hpp"

#include <algorithm>
#include <bit>

#include "check.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/dispatch.hpp"
#include "ffnlab/ops/few_rows.hpp"
#include "ffnlab/scratch.hpp"
#include "row_threshold.hpp"

namespace ffnlab {

namespace {

// f32 products of a few rows stream the weights (ops/few_rows) instead of going to oneDNN.
bool streams_few_rows(const Tensor& x, const Tensor& w, Precision precision, bool backward) {
  return few_rows_fits(x.dim(0), w.numel(), precision, backward) && x.dtype() == DType::f32 &&
         w.dtype() == DType::f32;
}

// Products whose rows vary from call to call (an MoE's expert blocks) run as fixed-shape oneDNN
// products, which run faster than its run-time-M primitive at these sizes: the rows rounded down
// to a multiple of q = max(kVaryingRowsMinQuantum, 2^⌊log2 M⌋ / kVaryingRowsShapesPerDoubling),
// then the rest the same way, so that a block size is one of a few shapes per doubling of M,
// each primitive created once (the cache holds 1024). Up to kFewRowsMax rows
// few_rows_runtime_m chooses (ops/dispatch.hpp has the thresholds).
std::int64_t main_rows(std::int64_t M) {
  const std::int64_t q = std::max<std::int64_t>(
      dispatch::kVaryingRowsMinQuantum,
      std::bit_floor(static_cast<std::uint64_t>(M)) / dispatch::kVaryingRowsShapesPerDoubling);
  return M / q * q;
}

// Whether an f32 product of M <= kFewRowsMax rows that does not stream takes oneDNN's
// run-time-M primitive rather than a fixed-shape one: whichever runs faster at those rows and
// that weight size.
bool few_rows_runtime_m(std::int64_t M, std::int64_t weight_elements) {
  return M <= dispatch::kRuntimeMMaxRows || weight_elements <= dispatch::kRuntimeMMaxWeight;
}

// dx [T, I] = dy [T, O] · w [O, I], split like linear_forward's rows.
void input_gradient(Tensor& dx, const Tensor& dy, const Tensor& w, Precision precision,
                    bool varying_rows, PackedWeights* packed) {
  const std::int64_t M = dy.dim(0), main = main_rows(M);
  check(dx.rank() == 2 && dx.dim(0) == M && dx.dim(1) == w.dim(1),
        "[linear] dx {} does not fit dy {} and weight {}", shape_string(dx.shape()),
        shape_string(dy.shape()), shape_string(w.shape()));
  if (varying_rows && M > kFewRowsMax) {
    if (main > 0 && main < M) {
      Tensor head = dx.rows(0, main), tail = dx.rows(main, M);
      input_gradient(head, dy.rows(0, main), w, precision, false, nullptr);
      input_gradient(tail, dy.rows(main, M), w, precision, true, nullptr);
      return;
    }
    varying_rows = false;
  }
  MatmulOptions opt;
  opt.precision = precision;
  if (packed) {
    packed->pack(w, Trans::no, M, opt);
    matmul(dx, dy, *packed, opt);
    return;
  }
  opt.dynamic_m = varying_rows;
  matmul(dx, dy, Trans::no, w, Trans::no, opt);
}

// Rows from which training products read packed weights (packs_weights): where the reorder
// costs less than it saves, where oneDNN's products are 512-bit; never elsewhere
// (dispatch::kPackingMinRows says why). set_weight_packing_min_rows changes it for benchmarks.
RowThreshold packing_min_rows;

}  // namespace

void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b,
                    Precision precision, const Act* act, bool varying_rows, PackedWeights* packed) {
  check(x.rank() == 2 && w.rank() == 2 && x.dim(1) == w.dim(1),
        "[linear] input {} does not fit weight {} ([out, in])", shape_string(x.shape()),
        shape_string(w.shape()));
  check(!packed || !varying_rows, "[linear] a packed weight needs fixed rows");
  if (streams_few_rows(x, w, precision, false)) {
    few_rows_linear(y, x, w, b);
    if (act) activation_forward(y.f32(), y.f32(), y.numel(), *act);
    return;
  }
  const std::int64_t M = x.dim(0);
  if (varying_rows && M > kFewRowsMax) {
    check(y.rank() == 2 && y.dim(0) == M && y.dim(1) == w.dim(0),
          "[linear] output {} does not fit input {} and weight {}", shape_string(y.shape()),
          shape_string(x.shape()), shape_string(w.shape()));
    const std::int64_t main = main_rows(M);
    if (main > 0 && main < M) {
      Tensor head = y.rows(0, main), tail = y.rows(main, M);
      linear_forward(head, x.rows(0, main), w, b, precision, act, false);
      linear_forward(tail, x.rows(main, M), w, b, precision, act, true);
      return;
    }
    varying_rows = false;  // one fixed shape: a whole multiple of its quantum
  }
  MatmulOptions opt;
  opt.bias = b;
  opt.act = act;
  opt.precision = precision;
  if (packed) {
    packed->pack(w, Trans::yes, M, opt);
    matmul(y, x, *packed, opt);
    return;
  }
  // A few f32 rows that do not stream take whichever primitive measured faster for them
  // (few_rows_runtime_m); up to 8 rows are at most 8 fixed shapes when they vary.
  opt.dynamic_m = precision == Precision::f32 && M <= kFewRowsMax ? few_rows_runtime_m(M, w.numel())
                                                                  : varying_rows;
  matmul(y, x, Trans::no, w, Trans::yes, opt);
}

bool packs_weights(std::int64_t M, Precision precision) {
  const std::int64_t from = weight_packing_min_rows();
  return from > 0 && M >= from &&
         (precision == Precision::f32 || converts_operands_once(precision));
}

std::int64_t weight_packing_min_rows() {
  return packing_min_rows.get(
      [] { return matmul_f32_512_bit() ? dispatch::kPackingMinRows : std::int64_t{0}; });
}

void set_weight_packing_min_rows(std::int64_t rows) {
  packing_min_rows.set(rows);
}

bool converts_operands_once(Precision precision) {
  static const bool native = matmul_bf16_native();
  return precision == Precision::bf16 && native;
}

const Tensor& product_operand(Tensor& out, const Tensor& t) {
  out.assign_converted(t, DType::bf16);
  return out;
}

void ProductOperands::start(bool train, Precision precision, std::int64_t rows) {
  copies_ = train && converts_operands_once(precision);
  packs_ = train && rows > 0 && packs_weights(rows, precision);
  precision_ = precision;
}

const Tensor& ProductOperands::weight(ProductWeight& k, const Tensor& w) const {
  if (packs_) {
    k.bf16 = Tensor();
    return w;
  }
  k.forward.reset();
  k.dx.reset();
  return (*this)(k.bf16, w);
}

const Tensor& ProductOperands::gradient(const Tensor& g) const {
  return copies_ ? product_operand(scratch(Scratch::grad_bf16), g) : g;
}

void ProductOperands::check_unchanged(Precision now, const char* layer) const {
  check(now == precision_,
        "{} the precision changed from {} to {} between the forward and the backward", layer,
        enum_name(precision_), enum_name(now));
}

void bias_backward(Tensor& db, const Tensor& dy) {
  const std::int64_t T = dy.dim(0), O = dy.dim(1);
  check(db.numel() == O, "[linear] bias gradient has {} elements, dy has {} columns", db.numel(),
        O);
  const float* g = dy.f32();
  float* out = db.f32();
  // Each thread owns a block of columns and sums its rows in order: no reduction across threads.
  constexpr std::int64_t kBlock = 64;
  const std::int64_t blocks = (O + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (T * O > 65536)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t c0 = blk * kBlock, c1 = std::min(O, c0 + kBlock);
    float acc[kBlock] = {};
    for (std::int64_t t = 0; t < T; ++t) {
      const float* row = g + t * O;
#pragma omp simd
      for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (std::int64_t c = c0; c < c1; ++c) out[c] += acc[c - c0];
  }
}

void linear_backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, Precision precision, bool varying_rows,
                     PackedWeights* packed) {
  check(dy.rank() == 2 && dy.dim(0) == x.dim(0) && dy.dim(1) == w.dim(0),
        "[linear] dy {} does not fit x {} and weight {}", shape_string(dy.shape()),
        shape_string(x.shape()), shape_string(w.shape()));
  check(!packed || !varying_rows, "[linear] a packed weight needs fixed rows");
  if (streams_few_rows(x, w, precision, true) && dw.dtype() == DType::f32) {
    few_rows_linear_backward(dx, dw, db, dy, x, w);
    return;
  }
  if (dx) input_gradient(*dx, dy, w, precision, varying_rows, packed);
  MatmulOptions opt;
  opt.precision = precision;
  opt.accumulate = true;
  opt.dynamic_k = varying_rows;  // dw: a sum over T (a run-time K measured at the fixed rate)
  matmul(dw, dy, Trans::yes, x, Trans::no, opt);
  if (db) bias_backward(*db, dy);
}

}  // namespace ffnlab
