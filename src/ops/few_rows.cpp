// Few-token products that stream the weights once: one row's dot products with every token at a
// time, in registers, then bias, activation and the gated mix per output element.
#include "ffnlab/ops/few_rows.hpp"

#include <algorithm>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <atomic>

#include "activation_kernels.hpp"
#include "check.hpp"
#include "ffnlab/ops/matmul.hpp"

namespace ffnlab {

namespace {

// Weight elements below which one thread does the whole product (a fork costs more).
constexpr std::int64_t kSerialElements = dispatch::kFewRowsSerialElements;

inline float widen(float w) {
  return w;
}
inline float widen(std::uint16_t w) {
  return bf16_to_f32(w);
}

// The tokens as a kernel reads them: [T, I] f32 (rounded to bf16 values for bf16 weights), and
// for the avx512_bf16 kernel the same values packed as bf16.
struct Tokens {
  const float* f32;
  const std::uint16_t* bf16 = nullptr;
};

// The dot kernels, one per instruction set, compiled with that set whatever the build targets
// (function target attributes) and chosen at run time (few_rows_isa): a binary built for one x86
// CPU runs on another. Each computes out[r·T + t] = Σ_i w_r[i]·x[t·I + i] for R consecutive rows
// w_r = w + r·I and the T tokens, each row loaded once per vector and multiplied into every
// token: R memory streams in flight and R·T independent accumulators, which one core needs when
// few tokens leave little arithmetic per byte read.

// Portable form (CPUs without AVX2, and other architectures): one loop per row and token, its
// reduction vectorised by GCC (clang reports that it cannot for bf16 weights, which -Werror
// would make an error, so it gets the plain loop).
template <int T, int R, typename W>
void dot_rows_portable(const W* w, std::int64_t I, const Tokens& tokens, float* out) {
  const float* x = tokens.f32;
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      const W* wr = w + r * I;
      const float* xt = x + t * I;
      float sum = 0.0f;
#if !defined(__clang__)
#pragma omp simd reduction(+ : sum)
#endif
      for (std::int64_t i = 0; i < I; ++i) sum += widen(wr[i]) * xt[i];
      out[r * T + t] = sum;
    }
}

#if defined(__x86_64__)
#define FFNLAB_AVX2 __attribute__((target("avx2,fma")))
#define FFNLAB_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl")))
#define FFNLAB_AVX512_BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))

FFNLAB_AVX2 inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
FFNLAB_AVX2 inline __m256 load8(const std::uint16_t* p) {  // bf16 -> f32 is a 16-bit shift
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
FFNLAB_AVX2 inline float lane_sum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

template <int T, int R, typename W>
FFNLAB_AVX2 void dot_rows_avx2(const W* w, std::int64_t I, const Tokens& tokens, float* out) {
  const float* x = tokens.f32;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 8 <= I; i += 8)
    for (int r = 0; r < R; ++r) {
      const __m256 wv = load8(w + r * I + i);
      for (int t = 0; t < T; ++t)
        acc[r][t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + t * I + i), acc[r][t]);
    }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      float sum = lane_sum(acc[r][t]);
      for (std::int64_t j = i; j < I; ++j) sum += widen(w[r * I + j]) * x[t * I + j];
      out[r * T + t] = sum;
    }
}

// GCC 12's AVX-512 headers pass an undefined vector as the unused pass-through of several
// intrinsics (_mm512_reduce_add_ps, the conversions), which its own -Wuninitialized reports.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// 16 bf16 to f32: a 16-bit shift of each.
FFNLAB_AVX512 inline __m512 widen16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// bf16 weights, 16 widened a vector; the last partial vector under a mask (no scalar tail).
template <int T, int R>
FFNLAB_AVX512 void dot_rows_avx512(const std::uint16_t* w, std::int64_t I, const Tokens& tokens,
                                   float* out) {
  const float* x = tokens.f32;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  std::int64_t i = 0;
  for (; i + 16 <= I; i += 16)
    for (int r = 0; r < R; ++r) {
      const __m512 wv =
          widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * I + i)));
      for (int t = 0; t < T; ++t)
        acc[r][t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + t * I + i), acc[r][t]);
    }
  if (i < I) {
    const __mmask16 m = static_cast<__mmask16>((1u << (I - i)) - 1u);
    for (int r = 0; r < R; ++r) {
      const __m512 wv = widen16(_mm256_maskz_loadu_epi16(m, w + r * I + i));
      for (int t = 0; t < T; ++t)
        acc[r][t] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + t * I + i), acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) out[r * T + t] = _mm512_reduce_add_ps(acc[r][t]);
}

// bf16 weights with avx512_bf16: the tokens packed as bf16 (token_rows, once per call), and
// each instruction multiplies 32 pairs of bf16 into 16 f32 sums (vdpbf16ps: exact products, f32
// sums in another order than one FMA at a time).
template <int T, int R>
FFNLAB_AVX512_BF16 void dot_rows_bf16(const std::uint16_t* w, std::int64_t I, const Tokens& tokens,
                                      float* out) {
  const float* x = tokens.f32;
  const std::uint16_t* xb = tokens.bf16;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  std::int64_t i = 0;
  for (; i + 32 <= I; i += 32) {
    __m512bh xv[T];
    for (int t = 0; t < T; ++t)
      xv[t] = reinterpret_cast<__m512bh>(
          _mm512_loadu_si512(reinterpret_cast<const void*>(xb + t * I + i)));
    for (int r = 0; r < R; ++r) {
      const __m512bh wv = reinterpret_cast<__m512bh>(
          _mm512_loadu_si512(reinterpret_cast<const void*>(w + r * I + i)));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv, xv[t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      float sum = _mm512_reduce_add_ps(acc[r][t]);
      for (std::int64_t j = i; j < I; ++j) sum += widen(w[r * I + j]) * x[t * I + j];
      out[r * T + t] = sum;
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// The ISA the kernels take now: the best this CPU runs, until set_few_rows_isa.
std::atomic<FewRowsIsa>& active_isa() {
  static std::atomic<FewRowsIsa> isa{[] {
    FewRowsIsa best = FewRowsIsa::portable;
    for (FewRowsIsa i : {FewRowsIsa::avx2, FewRowsIsa::avx512, FewRowsIsa::avx512_bf16})
      if (few_rows_isa_supported(i)) best = i;
    return best;
  }()};
  return isa;
}

// The dot kernel of R rows (and of one) for T tokens and weights W on `isa`.
template <int T, int R, typename W>
struct DotKernels {
  using Fn = void (*)(const W*, std::int64_t, const Tokens&, float*);
  Fn rows, one;
};
template <int T, int R, typename W>
DotKernels<T, R, W> dot_kernels(FewRowsIsa isa) {
#if defined(__x86_64__)
  // f32 weights keep the AVX2 kernel on the sets above it: the 512-bit one measured within
  // 0–7 % of it (reading bound at one token; at eight both lose to oneDNN on AVX-512), and it
  // sums in another order, which moved training runs of few-row MoE expert blocks across a
  // routing decision against one process (DataParallel tests). bf16 weights gain (1.3–1.4×).
  if constexpr (sizeof(W) == 2) {
    if (isa == FewRowsIsa::avx512_bf16) return {dot_rows_bf16<T, R>, dot_rows_bf16<T, 1>};
    if (isa == FewRowsIsa::avx512) return {dot_rows_avx512<T, R>, dot_rows_avx512<T, 1>};
  }
  if (isa != FewRowsIsa::portable) return {dot_rows_avx2<T, R, W>, dot_rows_avx2<T, 1, W>};
#endif
  (void)isa;
  return {dot_rows_portable<T, R, W>, dot_rows_portable<T, 1, W>};
}

// Rows read together for T tokens (dot_rows' R).
template <int T>
constexpr int rows_together() {
  return T == 1 ? 4 : (T == 2 ? 2 : 1);
}

// The kernels over rows [first, first + n) of w, n <= rows_together<T>():
// out[(row − first)·T + t].
template <int T, typename W>
inline void dots(const DotKernels<T, rows_together<T>(), W>& k, const W* w, std::int64_t first,
                 std::int64_t n, std::int64_t I, const Tokens& x, float* out) {
  if (n == rows_together<T>()) return k.rows(w + first * I, I, x, out);
  for (std::int64_t r = 0; r < n; ++r) k.one(w + (first + r) * I, I, x, out + r * T);
}

// The tokens as the kernels read them: x itself for f32 weights, x rounded to bf16 for bf16
// weights (in grow-only buffers of the calling thread), and packed as bf16 too for the
// avx512_bf16 kernel.
Tokens token_rows(const Tensor& x, DType weights, FewRowsIsa isa) {
  if (weights == DType::f32) return {x.f32()};
  thread_local std::vector<float> rounded;
  thread_local std::vector<std::uint16_t> packed;
  const std::int64_t n = x.numel();
  if (static_cast<std::int64_t>(rounded.size()) < n) rounded.resize(static_cast<std::size_t>(n));
  round_to_bf16(rounded.data(), x.f32(), n);
  if (isa != FewRowsIsa::avx512_bf16) return {rounded.data()};
  if (static_cast<std::int64_t>(packed.size()) < n) packed.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) packed[i] = f32_to_bf16(x.f32()[i]);
  return {rounded.data(), packed.data()};
}

// Calls f(std::integral_constant<int, T>, weights pointer) for the run-time T and dtype.
template <typename Fn>
void dispatch_tokens(std::int64_t T, const Tensor& w, Fn&& f) {
  auto with_w = [&](auto tokens) {
    if (w.dtype() == DType::bf16)
      f(tokens, w.bf16());
    else
      f(tokens, w.f32());
  };
  switch (T) {
    case 1:
      return with_w(std::integral_constant<int, 1>{});
    case 2:
      return with_w(std::integral_constant<int, 2>{});
    case 3:
      return with_w(std::integral_constant<int, 3>{});
    case 4:
      return with_w(std::integral_constant<int, 4>{});
    case 5:
      return with_w(std::integral_constant<int, 5>{});
    case 6:
      return with_w(std::integral_constant<int, 6>{});
    case 7:
      return with_w(std::integral_constant<int, 7>{});
    case 8:
      return with_w(std::integral_constant<int, 8>{});
    default:
      fail("[few_rows] {} tokens; the few-row kernels take 1 to {}", T, kFewRowsMax);
  }
}
static_assert(kFewRowsMax == 8, "dispatch_tokens lists every token count");

void check_operands(const Tensor& x, const Tensor& w, const Tensor* b, std::int64_t rows,
                    const char* what) {
  check(x.rank() == 2 && w.rank() == 2 && x.dim(1) == w.dim(1) && x.dtype() == DType::f32,
        "[few_rows] {}: input {} does not fit weight {} ([out, in])", what, shape_string(x.shape()),
        shape_string(w.shape()));
  check(x.dim(0) >= 1 && x.dim(0) <= kFewRowsMax, "[few_rows] {}: {} tokens; 1 to {} allowed", what,
        x.dim(0), kFewRowsMax);
  check(w.dim(0) == rows, "[few_rows] {}: weight {} has {} rows, expected {}", what,
        shape_string(w.shape()), w.dim(0), rows);
  check(!b || (b->numel() == rows && b->dtype() == DType::f32),
        "[few_rows] {}: bias must be f32 with {} elements", what, rows);
}

}  // namespace

std::int64_t few_rows_f32_max(std::int64_t weight_elements, bool backward) {
  // Against 512-bit oneDNN products the kernels (whose f32 stays 256-bit: dot_kernels says why)
  // lose sooner on wide weights.
  static const bool wide_onednn = matmul_f32_512_bit();
  if (!wide_onednn || weight_elements <= kFewRowsSmallWeight) return kFewRowsMax;
  return backward ? dispatch::kFewRowsWideMaxBackward : dispatch::kFewRowsWideMaxForward;
}

std::int64_t few_rows_bf16_max(std::int64_t inputs, std::int64_t weight_elements,
                               bool varying_rows) {
  static const bool native = matmul_bf16_native();
  if (!native || varying_rows || inputs < dispatch::kFewRowsBf16DeepInputs ||
      weight_elements < dispatch::kFewRowsBf16LargeWeight)
    return kFewRowsMax;
  return dispatch::kFewRowsBf16LargeMax;
}

bool few_rows_isa_supported(FewRowsIsa isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  switch (isa) {
    case FewRowsIsa::portable:
      return true;
    case FewRowsIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case FewRowsIsa::avx512:
      return few_rows_isa_supported(FewRowsIsa::avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    case FewRowsIsa::avx512_bf16:
      return few_rows_isa_supported(FewRowsIsa::avx512) && __builtin_cpu_supports("avx512bf16");
    case FewRowsIsa::count:
      break;
  }
  return false;
#else
  return isa == FewRowsIsa::portable;
#endif
}

std::vector<FewRowsIsa> supported_few_rows_isas() {
  std::vector<FewRowsIsa> out;
  for (FewRowsIsa i :
       {FewRowsIsa::portable, FewRowsIsa::avx2, FewRowsIsa::avx512, FewRowsIsa::avx512_bf16})
    if (few_rows_isa_supported(i)) out.push_back(i);
  return out;
}

FewRowsIsa few_rows_isa() {
  return active_isa().load(std::memory_order_relaxed);
}

void set_few_rows_isa(FewRowsIsa isa) {
  check(few_rows_isa_supported(isa), "[few_rows] this CPU does not run the {} kernels",
        enum_name(isa));
  active_isa().store(isa, std::memory_order_relaxed);
}

void few_rows_linear(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b,
                     bool accumulate) {
  const std::int64_t O = w.rank() == 2 ? w.dim(0) : -1;
  check_operands(x, w, b, O, "linear");
  const std::int64_t T = x.dim(0), I = x.dim(1);
  check(y.rank() == 2 && y.dim(0) == T && y.dim(1) == O,
        "[few_rows] linear: output {} must be [{}, {}]", shape_string(y.shape()), T, O);
  const FewRowsIsa isa = few_rows_isa();
  const Tokens xs = token_rows(x, w.dtype(), isa);
  const float* bias = b ? b->f32() : nullptr;
  float* out = y.f32();
  dispatch_tokens(T, w, [&](auto tokens, const auto* wp) {
    constexpr int NT = decltype(tokens)::value;
    constexpr int R = rows_together<NT>();
    using W = std::remove_cv_t<std::remove_pointer_t<decltype(wp)>>;
    const auto k = dot_kernels<NT, R, W>(isa);
    const std::int64_t groups = (O + R - 1) / R;
#pragma omp parallel for schedule(static) if (O * I > kSerialElements)
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t o0 = g * R, n = std::min<std::int64_t>(R, O - o0);
      float d[R * NT];
      dots<NT>(k, wp, o0, n, I, xs, d);
      for (std::int64_t r = 0; r < n; ++r) {
        const float bo = bias ? bias[o0 + r] : 0.0f;
        for (int t = 0; t < NT; ++t) {
          float& dst = out[t * O + o0 + r];
          dst = (accumulate ? dst : 0.0f) + d[r * NT + t] + bo;
        }
      }
    }
  });
}

void few_rows_mix(Tensor& h, const Tensor& x, const Tensor& w_in, const Tensor* b_in, Act act,
                  int branches) {
  check(branches >= 0, "[few_rows] mix: branches = {} must be >= 0", branches);
  const std::int64_t F = h.rank() == 2 ? h.dim(1) : -1;
  const std::int64_t P = branches == 0 ? F : 2 * branches * F;
  check_operands(x, w_in, b_in, P, "mix");
  const std::int64_t T = x.dim(0), D = x.dim(1);
  check(h.dim(0) == T, "[few_rows] mix: output {} must have {} rows", shape_string(h.shape()), T);
  const FewRowsIsa isa = few_rows_isa();
  const Tokens xs = token_rows(x, w_in.dtype(), isa);
  const float* bias = b_in ? b_in->f32() : nullptr;
  float* out = h.f32();
  kernels::dispatch(act.kind, [&](auto act_tag) {
    constexpr Activation A = decltype(act_tag)::value;
    const float beta = act.beta;
    dispatch_tokens(T, w_in, [&](auto tokens, const auto* wp) {
      constexpr int NT = decltype(tokens)::value;
      constexpr int R = rows_together<NT>();
      using W = std::remove_cv_t<std::remove_pointer_t<decltype(wp)>>;
      const auto k = dot_kernels<NT, R, W>(isa);
      const std::int64_t groups = (F + R - 1) / R;
#pragma omp parallel for schedule(static) if (P * D > kSerialElements)
      for (std::int64_t grp = 0; grp < groups; ++grp) {
        const std::int64_t f0 = grp * R, n = std::min<std::int64_t>(R, F - f0);
        float acc[R * NT] = {};
        if (branches == 0) {
          dots<NT>(k, wp, f0, n, D, xs, acc);
          for (std::int64_t r = 0; r < n; ++r) {
            const float bf = bias ? bias[f0 + r] : 0.0f;
            for (int t = 0; t < NT; ++t)
              acc[r * NT + t] = kernels::act_value<A>(acc[r * NT + t] + bf, beta);
          }
        }
        for (int br = 0; br < branches; ++br) {
          const std::int64_t g0 = 2 * br * F + f0, u0 = g0 + F;  // first gate and up rows
          float g[R * NT], u[R * NT];
          dots<NT>(k, wp, g0, n, D, xs, g);
          dots<NT>(k, wp, u0, n, D, xs, u);
          for (std::int64_t r = 0; r < n; ++r) {
            const float bg = bias ? bias[g0 + r] : 0.0f, bu = bias ? bias[u0 + r] : 0.0f;
            for (int t = 0; t < NT; ++t)
              acc[r * NT + t] +=
                  kernels::act_value<A>(g[r * NT + t] + bg, beta) * (u[r * NT + t] + bu);
          }
        }
        for (std::int64_t r = 0; r < n; ++r)
          for (int t = 0; t < NT; ++t) out[t * F + f0 + r] = acc[r * NT + t];
      }
    });
  });
}

void few_rows_linear_backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x,
                              const Tensor& w) {
  const std::int64_t O = w.rank() == 2 ? w.dim(0) : -1;
  check_operands(x, w, nullptr, O, "linear backward");
  const std::int64_t T = x.dim(0), I = x.dim(1);
  check(w.dtype() == DType::f32 && dw.dtype() == DType::f32 && dw.shape() == w.shape(),
        "[few_rows] linear backward: weight {} and its gradient {} must be f32 of one shape",
        shape_string(w.shape()), shape_string(dw.shape()));
  check(dy.rank() == 2 && dy.dim(0) == T && dy.dim(1) == O && dy.dtype() == DType::f32,
        "[few_rows] linear backward: dy {} must be [{}, {}]", shape_string(dy.shape()), T, O);
  check(!dx || (dx->rank() == 2 && dx->dim(0) == T && dx->dim(1) == I),
        "[few_rows] linear backward: dx {} must be [{}, {}]", dx ? shape_string(dx->shape()) : "",
        T, I);
  check(!db || (db->numel() == O && db->dtype() == DType::f32),
        "[few_rows] linear backward: db must be f32 with {} elements", O);
  const float* g = dy.f32();
  const float* xs = x.f32();
  const float* ws = w.f32();
  // dx: the rows in a fixed number of chunks (not one per thread, so that the sums do not depend
  // on the thread count), each streaming its rows in order, four at a time, into its own [T, I]
  // partial sum; then the partials are added in chunk order.
  constexpr std::int64_t kChunks = 4, kRows = 4;
  const bool parallel = O * I > kSerialElements;
  if (dx) {
    const std::int64_t chunks = std::min(kChunks, O);
    thread_local std::vector<float> partials;
    const auto need = static_cast<std::size_t>(chunks * T * I);
    if (partials.size() < need) partials.resize(need);
    float* part = partials.data();
#pragma omp parallel for schedule(static) if (parallel)
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      const std::int64_t o0 = ch * O / chunks, o1 = (ch + 1) * O / chunks;
      float* p = part + ch * T * I;
      std::fill(p, p + T * I, 0.0f);
      std::int64_t o = o0;
      for (; o + kRows <= o1; o += kRows) {
        const float *w0 = ws + o * I, *w1 = w0 + I, *w2 = w1 + I, *w3 = w2 + I;
        for (std::int64_t t = 0; t < T; ++t) {
          const float* gt = g + t * O + o;
          const float g0 = gt[0], g1 = gt[1], g2 = gt[2], g3 = gt[3];
          if (g0 == 0.0f && g1 == 0.0f && g2 == 0.0f && g3 == 0.0f) continue;
          float* pt = p + t * I;
#pragma omp simd
          for (std::int64_t c = 0; c < I; ++c)
            pt[c] += g0 * w0[c] + g1 * w1[c] + g2 * w2[c] + g3 * w3[c];
        }
      }
      for (; o < o1; ++o)
        for (std::int64_t t = 0; t < T; ++t) {
          const float gt = g[t * O + o];
          if (gt == 0.0f) continue;
          const float* wr = ws + o * I;
          float* pt = p + t * I;
#pragma omp simd
          for (std::int64_t c = 0; c < I; ++c) pt[c] += gt * wr[c];
        }
    }
    float* out = dx->f32();
    const std::int64_t n = T * I;
#pragma omp parallel for simd schedule(static) if (parallel)
    for (std::int64_t i = 0; i < n; ++i) {
      float sum = 0.0f;  // no rows (O = 0): dx = 0
      for (std::int64_t ch = 0; ch < chunks; ++ch) sum += part[ch * n + i];
      out[i] = sum;
    }
  }
  constexpr std::int64_t kColumns = 128;  // dW: a row's sums over the tokens, a block at a time
  float* dws = dw.f32();
  float* dbs = db ? db->f32() : nullptr;
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t o = 0; o < O; ++o) {
    float go[kFewRowsMax];
    float sum = 0.0f;
    bool any = false;
    for (std::int64_t t = 0; t < T; ++t) {
      go[t] = g[t * O + o];
      sum += go[t];
      any |= go[t] != 0.0f;
    }
    if (dbs) dbs[o] += sum;
    if (!any) continue;
    float* dwr = dws + o * I;
    // The row's product is summed over the tokens first and then added, as dw += dyᵀ·x reads.
    for (std::int64_t c0 = 0; c0 < I; c0 += kColumns) {
      const std::int64_t n = std::min(kColumns, I - c0);
      float acc[kColumns];
#pragma omp simd
      for (std::int64_t c = 0; c < n; ++c) acc[c] = go[0] * xs[c0 + c];
      for (std::int64_t t = 1; t < T; ++t) {
        const float* xt = xs + t * I + c0;
#pragma omp simd
        for (std::int64_t c = 0; c < n; ++c) acc[c] += go[t] * xt[c];
      }
#pragma omp simd
      for (std::int64_t c = 0; c < n; ++c) dwr[c0 + c] += acc[c];
    }
  }
}

}  // namespace ffnlab
