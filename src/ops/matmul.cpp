// oneDNN matmul behind ffnlab's matmul(): memory descriptors by strides, post-ops for bias,
// activation and accumulation, a primitive cache, and bf16 conversion of the inputs.
//
// Where its f32 products are not 512-bit, oneDNN 2.6 computes a row-major product of many rows
// faster as a 1x1 convolution (tokens as its width, channels last) than as a matmul: its AVX2
// 1x1 kernel outruns its AVX2 GEMM (dispatch::kConvMinRows has the measurement). That path
// reorders the second operand into the convolution's blocked weights layout, in per-thread
// scratch, on every call (its time is inside what bench_libraries measures for the path), so
// callers see the same matmul(). The scratch (a slot of ffnlab/scratch.hpp) grows to the largest
// weight a thread reorders and is kept until the thread ends or releases its scratch.
//
// Threads may call matmul() at once (ranks as threads, Python layers with the GIL released): a
// primitive is safe to execute concurrently, but oneDNN's library-managed scratchpad is one
// global buffer unless the library was built for concurrent execution, and a stream belongs to
// one thread. So each thread has its own stream and its own scratchpad, passed to every call
// (scratchpad_mode::user). Sharing them, the trainer over ThreadGroup ranks (tests/unit,
// test_data_parallel) ended with other weights than one process in 15 runs of 15; with them
// per thread, in none of 12.
#include "ffnlab/ops/matmul.hpp"

#include <omp.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "check.hpp"
#include "ffnlab/ops/dispatch.hpp"
#include "ffnlab/scratch.hpp"
#include "row_threshold.hpp"

namespace ffnlab {

namespace {

using dnnl::memory;
// G M N K ta tb precision bias accumulate act beta threads path. The OpenMP thread count is
// part of the key: a primitive plans its work (and so the order of its sums) for the threads it
// was made with, and the study trains runs side by side on one thread each beside callers on
// several. path: b plain, packed (b in the layout oneDNN chose: PackedWeights) or reordered for
// a 1x1 convolution (Path).
using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, int, int, int,
                       int, int, float, int, int>;

constexpr std::size_t kMaxPrimitives = 1024;

// Rows from which f32 products run as a 1x1 convolution (dispatch::kConvMinRows says where and
// why); 0: never.
RowThreshold conv_min_rows;
std::atomic<std::int64_t> conv_products{0};

// How a product reads b: as stored (oneDNN's matmul), packed by PackedWeights (its matmul with
// the layout it chose), or reordered on each call for its 1x1 convolution (matmul_conv_min_rows).
enum class Path : int { plain, packed, conv };

struct Entry {
  dnnl::primitive prim;  // a matmul, or a convolution (Path::conv)
  std::size_t scratchpad_bytes = 0;
  bool emulated_bf16 = false;  // a bf16 product run as f32 on bf16-rounded inputs
  memory::desc weights;        // b's layout as the primitive reads it (packed: oneDNN's choice)
  memory::desc bias;           // the bias as the primitive reads it
  memory::desc stored;         // Path::conv: b as stored, read as the convolution's weights
  dnnl::reorder to_weights;    // Path::conv: `stored` -> `weights`
};

struct Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::map<Key, Entry> cache;
  bool bf16_native = true;  // until oneDNN refuses a bf16 product on this CPU
};

Engine& engine() {
  static Engine e;
  return e;
}

// The oneDNN post-ops that compute an activation (empty for identity).
void append_activation(dnnl::post_ops& ops, const Act& act) {
  using dnnl::algorithm;
  switch (act.kind) {
    case Activation::relu:
      ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
      break;
    case Activation::gelu:
      ops.append_eltwise(1.f, algorithm::eltwise_gelu_erf, 0.f, 0.f);
      break;
    case Activation::gelu_tanh:
      ops.append_eltwise(1.f, algorithm::eltwise_gelu_tanh, 0.f, 0.f);
      break;
    case Activation::gelu_quick:
      ops.append_eltwise(1.f, algorithm::eltwise_swish, 1.702f, 0.f);
      break;
    case Activation::silu:
      ops.append_eltwise(1.f, algorithm::eltwise_swish, act.beta, 0.f);
      break;
    case Activation::sigmoid:
      ops.append_eltwise(1.f, algorithm::eltwise_logistic, 0.f, 0.f);
      break;
    case Activation::tanh:
      ops.append_eltwise(1.f, algorithm::eltwise_tanh, 0.f, 0.f);
      break;
    case Activation::relu2:
      ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
      ops.append_eltwise(1.f, algorithm::eltwise_square, 0.f, 0.f);
      break;
    case Activation::identity:
    case Activation::count:
      break;
  }
}

memory::desc matrix_desc(std::int64_t batch, std::int64_t rows, std::int64_t cols, Trans t,
                         memory::data_type dt, bool runtime_rows = false,
                         bool runtime_cols = false) {
  // A row-major matrix stored [rows, cols], or stored [cols, rows] and read transposed; with
  // batch > 0, `batch` such matrices one after the other. A run-time dimension (and the stride
  // it sets) is left for execution time.
  const std::int64_t r = runtime_rows ? DNNL_RUNTIME_DIM_VAL : rows;
  const std::int64_t c = runtime_cols ? DNNL_RUNTIME_DIM_VAL : cols;
  const memory::dims strides = t == Trans::no ? memory::dims{c, 1} : memory::dims{1, r};
  if (batch == 0) return memory::desc({r, c}, dt, strides);
  const std::int64_t step = runtime_rows || runtime_cols ? DNNL_RUNTIME_DIM_VAL : rows * cols;
  return memory::desc({batch, r, c}, dt, memory::dims{step, strides[0], strides[1]});
}

// At least `bytes` of the calling thread's tensor of `slot` (grow-only: a smaller request keeps
// the memory).
void* byte_scratch(Scratch slot, std::size_t bytes) {
  Tensor& t = scratch(slot);
  const auto words = static_cast<std::int64_t>((bytes + 3) / 4);
  if (!t.defined() || t.numel() < words) t = Tensor({words});
  return t.f32();
}

// The calling thread's scratch for a converted operand (bf16, or bf16-rounded f32) of n
// elements: slot 0 for a, 1 for b.
template <typename T>
T* conversion_buffer(int slot, std::int64_t n) {
  return static_cast<T*>(byte_scratch(slot == 0 ? Scratch::matmul_a : Scratch::matmul_b,
                                      static_cast<std::size_t>(n) * sizeof(T)));
}

void to_bf16(std::uint16_t* dst, const float* src, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void widen_bf16(float* dst, const std::uint16_t* src, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace

namespace {
Entry find_or_make(std::int64_t G, std::int64_t M, std::int64_t N, std::int64_t K, Trans ta,
                   Trans tb, const MatmulOptions& opt, Path path);

// oneDNN's failure to create or run `what` as ffnlab's: memory is ENOMEM (Python's
// MemoryError), anything else the system's, with oneDNN's words.
[[noreturn]] void fail_dnnl(const dnnl::error& error, std::string_view what) {
  if (error.status == dnnl_out_of_memory) fail_errno(ENOMEM, "[matmul] out of memory for {}", what);
  fail_system("[matmul] oneDNN failed on {}: {}", what, error.what());
}

std::string product_name(std::int64_t M, std::int64_t N, std::int64_t K) {
  return fmt::format("the product [{}, {}] x [{}, {}]", M, K, K, N);
}
}  // namespace

bool matmul_bf16_native() try {
  // The first bf16 primitive finds out. Made directly rather than through matmul(), which asks
  // this function whether a bf16 product may run as a convolution.
  MatmulOptions opt;
  opt.precision = Precision::bf16;
  find_or_make(0, 1, 16, 16, Trans::no, Trans::no, opt, Path::plain);
  std::lock_guard lock(engine().mutex);
  return engine().bf16_native;
} catch (const dnnl::error& error) {  // oneDNN's engine
  fail_dnnl(error, "finding out whether bf16 products are native");
}

bool matmul_f32_512_bit() {
  // The ISA values are nested bit sets: every AVX-512 one (avx512_core and its successors, in
  // oneDNN 3 too) contains avx512_core's bits, or the Xeon Phi's avx512_mic; avx2_vnni neither.
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto contains = [&](dnnl_cpu_isa_t of) {
    return (isa & static_cast<unsigned>(of)) == static_cast<unsigned>(of);
  };
  return contains(dnnl_cpu_isa_avx512_core) || contains(dnnl_cpu_isa_avx512_mic);
}

std::int64_t matmul_conv_min_rows() {
  return conv_min_rows.get(
      [] { return matmul_f32_512_bit() ? std::int64_t{0} : dispatch::kConvMinRows; });
}

void set_matmul_conv_min_rows(std::int64_t rows) {
  conv_min_rows.set(rows);
}

std::int64_t matmul_conv_products() {
  return conv_products.load(std::memory_order_relaxed);
}

std::int64_t matmul_primitive_count() {
  std::lock_guard lock(engine().mutex);
  return static_cast<std::int64_t>(engine().cache.size());
}

namespace {

Key make_key(std::int64_t G, std::int64_t M, std::int64_t N, std::int64_t K, Trans ta, Trans tb,
             const MatmulOptions& opt, Path path) {
  return Key{G,
             opt.dynamic_m ? -1 : M,
             N,
             opt.dynamic_k ? -1 : K,
             static_cast<int>(ta),
             static_cast<int>(tb),
             opt.precision == Precision::bf16,
             opt.bias != nullptr,
             opt.accumulate,
             opt.act ? static_cast<int>(opt.act->kind) : -1,
             opt.act ? opt.act->beta : 0.f,
             omp_get_max_threads(),
             static_cast<int>(path)};
}

// The convolution that computes c [M, N] = a [M, K] · op(b) (Path::conv): tokens as the width of
// a 1-D convolution with channels last, so a is its source {1, K, M} and c its destination
// {1, N, M} as stored; b its weights {N, K, 1} in the blocked layout the kernel chooses, with the
// reorder into it from b as stored. Left empty where oneDNN chooses a kernel other than its AVX2
// 1x1 one (its AVX-512 kernel, whose matmul is as fast; or a slower fallback): the product then
// stays a matmul.
void make_conv(Entry& made, std::int64_t M, std::int64_t N, std::int64_t K, Trans tb,
               const MatmulOptions& opt, const dnnl::primitive_attr& attr,
               const dnnl::engine& eng) {
  using tag = memory::format_tag;
  const auto f32 = memory::data_type::f32;
  const memory::desc src({1, K, M}, f32, tag::nwc), dst({1, N, M}, f32, tag::nwc),
      weights({N, K, 1}, f32, tag::any), bias({N}, f32, tag::a);
  const memory::dims none{0}, stride{1};
  const auto desc = opt.bias
                        ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                          dnnl::algorithm::convolution_direct, src,
                                                          weights, bias, dst, stride, none, none)
                        : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                          dnnl::algorithm::convolution_direct, src,
                                                          weights, dst, stride, none, none);
  const dnnl::convolution_forward::primitive_desc pd(desc, attr, eng);
  // Only the AVX2 kernel was measured (dispatch::kConvMinRows); any other stays a matmul.
  if (std::string_view(pd.impl_info_str()).rfind("jit_1x1:avx2", 0) != 0) return;
  // b stored [K, N] (read as it is) or [N, K] (read transposed), as weights {N, K, 1}.
  const memory::desc stored({N, K, 1}, f32,
                            tb == Trans::no ? memory::dims{1, N, 1} : memory::dims{K, 1, 1});
  made.scratchpad_bytes = pd.scratchpad_desc().get_size();
  made.weights = pd.weights_desc();
  made.bias = bias;
  made.stored = stored;
  made.to_weights = dnnl::reorder(dnnl::reorder::primitive_desc(eng, stored, eng, made.weights));
  made.prim = dnnl::convolution_forward(pd);
}

// The cached primitive of a product, created on first use. Path::packed: b's layout left to
// oneDNN (format_tag::any; native bf16 or f32 only). Path::conv: f32 inputs, G = 0, a read as
// stored, fixed M and K; an entry without a primitive where the convolution has no fast kernel.
Entry find_or_make(std::int64_t G, std::int64_t M, std::int64_t N, std::int64_t K, Trans ta,
                   Trans tb, const MatmulOptions& opt, Path path) {
  const Key key = make_key(G, M, N, K, ta, tb, opt, path);
  const bool bf16 = opt.precision == Precision::bf16;
  const bool packed = path == Path::packed;
  Engine& e = engine();
  std::lock_guard lock(e.mutex);
  auto it = e.cache.find(key);
  if (it != e.cache.end()) return it->second;
  // Bounded: a process that sees ever new shapes (a fuzzer, a server with varying token
  // counts) would otherwise keep every primitive. Primitives in use are reference counted.
  if (e.cache.size() >= kMaxPrimitives) e.cache.clear();
  dnnl::post_ops ops;
  if (opt.accumulate) ops.append_sum(1.f);
  if (opt.act) append_activation(ops, *opt.act);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  Entry made;
  if (path == Path::conv) {
    try {
      make_conv(made, M, N, K, tb, opt, attr, e.engine);
    } catch (const dnnl::error& error) {  // no convolution for it: it stays a matmul
      if (error.status != dnnl_unimplemented) fail_dnnl(error, product_name(M, N, K));
      made = Entry();
    }
    made.emulated_bf16 = bf16;
    return e.cache.emplace(key, made).first->second;
  }
  const bool dm = opt.dynamic_m, dk = opt.dynamic_k;
  made.bias = memory::desc({1, N}, memory::data_type::f32, memory::dims{N, 1});
  auto create = [&](memory::data_type in_dt) {
    const auto a_rt = matrix_desc(G, M, K, ta, in_dt, dm, dk);
    const auto b_rt = packed ? memory::desc({K, N}, in_dt, memory::format_tag::any)
                             : matrix_desc(G, K, N, tb, in_dt, dk, false);
    const auto c_rt = matrix_desc(G, M, N, Trans::no, memory::data_type::f32, dm, false);
    auto desc = opt.bias ? dnnl::matmul::desc(a_rt, b_rt, made.bias, c_rt)
                         : dnnl::matmul::desc(a_rt, b_rt, c_rt);
    return dnnl::matmul::primitive_desc(desc, attr, e.engine);
  };
  // `probe`: a product oneDNN does not implement stays its dnnl::error, for the bf16 probe below.
  auto make = [&](memory::data_type in_dt, bool probe) {
    try {
      const auto pd = create(in_dt);
      made.scratchpad_bytes = pd.scratchpad_desc().get_size();
      made.weights = pd.weights_desc();
      made.prim = dnnl::matmul(pd);
    } catch (const dnnl::error& error) {
      if (probe && error.status == dnnl_unimplemented) throw;
      fail_dnnl(error, product_name(M, N, K));
    }
  };
  if (bf16 && packed) {
    // Only where plain bf16 products are native (PackedWeights::pack checks): a failure here is
    // oneDNN's error, not a sign that the CPU lacks bf16.
    make(memory::data_type::bf16, false);
  } else if (bf16 && e.bf16_native) {
    try {
      make(memory::data_type::bf16, true);
    } catch (const dnnl::error&) {
      // oneDNN has no bf16 product for this CPU (it needs AVX-512 or AMX): from now on
      // bf16 products are emulated exactly, below. (Another failure, memory, is an error.)
      e.bf16_native = false;
    }
  }
  if (!made.prim) {
    make(memory::data_type::f32, false);
    made.emulated_bf16 = bf16;
  }
  return e.cache.emplace(key, made).first->second;
}

// This thread's stream (see the top of the file).
dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(engine().engine);
  return stream;
}

// Operand t as the primitive reads it. Native bf16: stored in bf16 (weights packed once for
// inference, or converted once by a layer) as it is, f32 converted into per-thread scratch.
// Emulated bf16: the f32 values of its bf16 rounding — bf16 products are exact in f32 and the
// accumulation is f32 either way, so this computes what a bf16 product computes.
const void* operand(const Tensor& t, int slot, bool bf16, bool native_bf16) {
  if (native_bf16) {
    if (t.dtype() == DType::bf16) return t.bf16();
    std::uint16_t* t16 = conversion_buffer<std::uint16_t>(slot, t.numel());
    to_bf16(t16, t.f32(), t.numel());
    return t16;
  }
  if (!bf16) return t.f32();
  float* rounded = conversion_buffer<float>(slot, t.numel());
  if (t.dtype() == DType::bf16)
    widen_bf16(rounded, t.bf16(), t.numel());
  else
    round_to_bf16(rounded, t.f32(), t.numel());
  return rounded;
}

// Runs a primitive on a, b (plain, packed or reordered memory) and c, with this thread's stream
// and scratchpad (see the top of the file).
void run(const Entry& entry, const memory& a_mem, const memory& b_mem, Tensor& c,
         const memory::desc& c_md, const MatmulOptions& opt) {
  const dnnl::engine& eng = engine().engine;
  memory c_mem(c_md, eng, c.f32());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
  if (opt.bias)
    args.emplace(DNNL_ARG_BIAS, memory(entry.bias, eng, const_cast<float*>(opt.bias->f32())));
  if (entry.scratchpad_bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 memory(memory::desc({static_cast<memory::dim>(entry.scratchpad_bytes)},
                                     memory::data_type::u8, memory::dims{1}),
                        eng, byte_scratch(Scratch::matmul_scratchpad, entry.scratchpad_bytes)));
  dnnl::stream& stream = thread_stream();
  entry.prim.execute(stream, args);
  stream.wait();
}

// Whether c = a · op(b) runs as Path::conv: not batched, a read as stored, fixed shapes, enough
// rows, f32 inputs (f32, or bf16 where bf16 products are emulated in f32).
bool runs_as_conv(std::int64_t G, std::int64_t M, Trans ta, const MatmulOptions& opt) {
  if (G != 0 || ta != Trans::no || opt.dynamic_m || opt.dynamic_k) return false;
  const std::int64_t from = matmul_conv_min_rows();
  if (from == 0 || M < from) return false;
  if (opt.precision == Precision::f32) return true;
  static const bool native_bf16 = matmul_bf16_native();
  return !native_bf16;
}

// c [M, N] = a [M, K] · op(b) as the convolution of `entry`: b (its f32 values, or in an emulated
// bf16 product those of its bf16 rounding) reordered into the kernel's layout in per-thread
// scratch, then the convolution on a and c as they are stored.
void conv_product(const Entry& entry, Tensor& c, const Tensor& a, const Tensor& b, std::int64_t M,
                  std::int64_t N, std::int64_t K, bool bf16, const MatmulOptions& opt) {
  using tag = memory::format_tag;
  const auto f32 = memory::data_type::f32;
  const dnnl::engine& eng = engine().engine;
  memory stored(entry.stored, eng, const_cast<void*>(operand(b, 1, bf16, false)));
  memory weights(entry.weights, eng, byte_scratch(Scratch::conv_weights, entry.weights.get_size()));
  dnnl::stream& stream = thread_stream();
  entry.to_weights.execute(stream, stored, weights);
  conv_products.fetch_add(1, std::memory_order_relaxed);
  memory a_mem(memory::desc({1, K, M}, f32, tag::nwc), eng,
               const_cast<void*>(operand(a, 0, bf16, false)));
  run(entry, a_mem, weights, c, memory::desc({1, N, M}, f32, tag::nwc), opt);
}

}  // namespace

void matmul(Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
            const MatmulOptions& opt) try {
  const int rank = c.rank();
  check((rank == 2 || rank == 3) && a.rank() == rank && b.rank() == rank &&
            (rank == 2 || (a.dim(0) == c.dim(0) && b.dim(0) == c.dim(0))),
        "[matmul] operands must be matrices or equal batches of matrices, got {} {} -> {}",
        shape_string(a.shape()), shape_string(b.shape()), shape_string(c.shape()));
  check(rank == 2 || !opt.bias, "[matmul] a bias is not supported for batched products");
  const std::int64_t G = rank == 3 ? c.dim(0) : 0;  // 0: not batched
  const int r0 = rank - 2;
  const std::int64_t M = ta == Trans::no ? a.dim(r0) : a.dim(r0 + 1);
  const std::int64_t K = ta == Trans::no ? a.dim(r0 + 1) : a.dim(r0);
  const std::int64_t Kb = tb == Trans::no ? b.dim(r0) : b.dim(r0 + 1);
  const std::int64_t N = tb == Trans::no ? b.dim(r0 + 1) : b.dim(r0);
  check(K == Kb && c.dim(r0) == M && c.dim(r0 + 1) == N,
        "[matmul] shapes do not chain: {}{} x {}{} -> {}", shape_string(a.shape()),
        ta == Trans::yes ? "^T" : "", shape_string(b.shape()), tb == Trans::yes ? "^T" : "",
        shape_string(c.shape()));
  check(c.dtype() == DType::f32 && (opt.precision == Precision::bf16 ||
                                    (a.dtype() == DType::f32 && b.dtype() == DType::f32)),
        "[matmul] bf16 operands need precision bf16; the output is f32");
  check(!opt.bias || opt.bias->numel() == N, "[matmul] bias has {} elements, expected {}",
        opt.bias ? opt.bias->numel() : 0, N);
  if (M == 0 || N == 0 || (rank == 3 && G == 0)) return;
  if (K == 0) {  // an empty sum: oneDNN rejects zero-sized K
    check(!opt.bias && !opt.act, "[matmul] K = 0 with a bias or activation is not supported");
    if (!opt.accumulate) c.zero();
    return;
  }

  const bool bf16 = opt.precision == Precision::bf16;
  if (runs_as_conv(G, M, ta, opt)) {
    const Entry entry = find_or_make(G, M, N, K, ta, tb, opt, Path::conv);
    if (entry.prim) {
      conv_product(entry, c, a, b, M, N, K, bf16, opt);
      return;
    }
  }
  const Entry entry = find_or_make(G, M, N, K, ta, tb, opt, Path::plain);
  const bool native_bf16 = bf16 && !entry.emulated_bf16;
  const auto in_dt = native_bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const dnnl::engine& eng = engine().engine;
  memory a_mem(matrix_desc(G, M, K, ta, in_dt), eng,
               const_cast<void*>(operand(a, 0, bf16, native_bf16)));
  memory b_mem(matrix_desc(G, K, N, tb, in_dt), eng,
               const_cast<void*>(operand(b, 1, bf16, native_bf16)));
  run(entry, a_mem, b_mem, c, matrix_desc(G, M, N, Trans::no, memory::data_type::f32), opt);
} catch (const dnnl::error& error) {  // running it: memory, or anything else
  fail_dnnl(error,
            fmt::format("the product {} x {}", shape_string(a.shape()), shape_string(b.shape())));
}

namespace {
std::atomic<std::int64_t> packings{0};
}  // namespace

std::int64_t matmul_packings() {
  return packings.load(std::memory_order_relaxed);
}

struct PackedWeights::State {
  Key key;      // the product it was packed for (rows, options, precision, threads)
  Entry entry;  // that product's primitive, whose weights layout `packed` has
  Trans tb = Trans::no;
  std::int64_t K = 0, N = 0;
  memory::desc source;    // the plain operand it is packed from
  memory packed;          // oneDNN's copy in its own layout (owns its buffer)
  dnnl::reorder reorder;  // source -> packed
};

void PackedWeights::pack(const Tensor& b, Trans tb, std::int64_t M, const MatmulOptions& opt) try {
  check(b.rank() == 2, "[matmul] a packed operand must be a matrix, got {}",
        shape_string(b.shape()));
  check(!opt.dynamic_m && !opt.dynamic_k, "[matmul] a packed operand needs fixed dimensions");
  check(M > 0, "[matmul] packing for {} rows", M);
  const bool bf16 = opt.precision == Precision::bf16;
  check(bf16 || b.dtype() == DType::f32, "[matmul] a bf16 operand needs precision bf16");
  static const bool native_bf16 = matmul_bf16_native();
  check(!bf16 || native_bf16, "[matmul] a packed bf16 operand needs native bf16 products");
  const std::int64_t K = tb == Trans::no ? b.dim(0) : b.dim(1);
  const std::int64_t N = tb == Trans::no ? b.dim(1) : b.dim(0);
  check(K > 0 && N > 0, "[matmul] cannot pack an empty operand {}", shape_string(b.shape()));
  const Key key = make_key(0, M, N, K, Trans::no, tb, opt, Path::packed);
  const dnnl::engine& eng = engine().engine;
  const auto source = matrix_desc(
      0, K, N, tb, b.dtype() == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32);
  if (!state_ || state_.use_count() > 1 || state_->key != key || state_->source != source) {
    // A new product (or a copy shares this one's memory): its primitive, a buffer in its
    // weights layout and the reorder into it. Kept, so that packing again for the same product
    // (every step) only runs the reorder.
    auto s = std::make_shared<State>();
    s->key = key;
    s->entry = find_or_make(0, M, N, K, Trans::no, tb, opt, Path::packed);
    s->tb = tb;
    s->K = K;
    s->N = N;
    s->source = source;
    s->packed = memory(s->entry.weights, eng);
    s->reorder = dnnl::reorder(dnnl::reorder::primitive_desc(eng, source, eng, s->entry.weights));
    state_ = std::move(s);
  }
  packings.fetch_add(1, std::memory_order_relaxed);
  memory src(source, eng, const_cast<void*>(b.raw()));
  dnnl::stream& stream = thread_stream();
  state_->reorder.execute(stream, src, state_->packed);
  stream.wait();
} catch (const dnnl::error& error) {  // its buffer, the reorder or running it: memory, or else
  fail_dnnl(error,
            "packing the weights of " + product_name(M, tb == Trans::no ? b.dim(1) : b.dim(0),
                                                     tb == Trans::no ? b.dim(0) : b.dim(1)));
}

void matmul(Tensor& c, const Tensor& a, const PackedWeights& b, const MatmulOptions& opt) try {
  check(b.packed(), "[matmul] the operand was not packed");
  const PackedWeights::State& s = *b.state_;
  check(
      a.rank() == 2 && c.rank() == 2 && a.dim(1) == s.K && c.dim(0) == a.dim(0) && c.dim(1) == s.N,
      "[matmul] shapes do not chain: {} x packed [{}, {}] -> {}", shape_string(a.shape()), s.K, s.N,
      shape_string(c.shape()));
  const bool bf16 = opt.precision == Precision::bf16;
  check(c.dtype() == DType::f32 && (bf16 || a.dtype() == DType::f32),
        "[matmul] bf16 operands need precision bf16; the output is f32");
  const std::int64_t M = a.dim(0), K = s.K, N = s.N;
  check(!opt.bias || opt.bias->numel() == N, "[matmul] bias has {} elements, expected {}",
        opt.bias ? opt.bias->numel() : 0, N);
  check(make_key(0, M, N, K, Trans::no, s.tb, opt, Path::packed) == s.key,
        "[matmul] the operand was packed for another product (rows, options or precision)");
  // The primitive the layout was chosen by (kept with it, so a refill of the cache cannot pair
  // the packed memory with another primitive).
  const auto in_dt = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const dnnl::engine& eng = engine().engine;
  memory a_mem(matrix_desc(0, M, K, Trans::no, in_dt), eng,
               const_cast<void*>(operand(a, 0, bf16, bf16)));
  run(s.entry, a_mem, s.packed, c, matrix_desc(0, M, N, Trans::no, memory::data_type::f32), opt);
} catch (const dnnl::error& error) {  // running it: memory, or anything else
  fail_dnnl(error, fmt::format("the product {} x packed weights", shape_string(a.shape())));
}

}  // namespace ffnlab
