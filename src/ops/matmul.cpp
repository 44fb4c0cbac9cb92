// oneDNN matmul behind ffnlab's matmul(): memory descriptors by strides, post-ops for bias,
// activation and accumulation, a primitive cache, and bf16 conversion of the inputs.
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

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "check.hpp"

namespace ffnlab {

namespace {

using dnnl::memory;
// G M N K ta tb precision bias accumulate act beta threads. The OpenMP thread count is part of
// the key: a primitive plans its work (and so the order of its sums) for the threads it was made
// with, and the study trains runs side by side on one thread each beside callers on several.
using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, int, int, int,
                       int, int, float, int>;

constexpr std::size_t kMaxPrimitives = 1024;

struct Entry {
  dnnl::matmul prim;
  std::size_t scratchpad_bytes = 0;
  bool emulated_bf16 = false;  // a bf16 product run as f32 on bf16-rounded inputs
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

// Grow-only per-thread scratch for the converted inputs (bf16, or bf16-rounded f32).
template <typename T>
T* scratch(int slot, std::int64_t n) {
  thread_local std::vector<T> buffers[2];
  auto& b = buffers[slot];
  if (static_cast<std::int64_t>(b.size()) < n) b.resize(static_cast<std::size_t>(n));
  return b.data();
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

bool matmul_bf16_native() {
  Tensor a({1, 16}), b({16, 16}), c({1, 16});
  MatmulOptions opt;
  opt.precision = Precision::bf16;
  matmul(c, a, Trans::no, b, Trans::no, opt);  // the first bf16 product finds out
  std::lock_guard lock(engine().mutex);
  return engine().bf16_native;
}

std::int64_t matmul_primitive_count() {
  std::lock_guard lock(engine().mutex);
  return static_cast<std::int64_t>(engine().cache.size());
}

void matmul(Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
            const MatmulOptions& opt) {
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
  const int act = opt.act ? static_cast<int>(opt.act->kind) : -1;
  const Key key{G,
                opt.dynamic_m ? -1 : M,
                N,
                opt.dynamic_k ? -1 : K,
                static_cast<int>(ta),
                static_cast<int>(tb),
                bf16,
                opt.bias != nullptr,
                opt.accumulate,
                act,
                opt.act ? opt.act->beta : 0.f,
                omp_get_max_threads()};

  Engine& e = engine();
  Entry entry;
  {
    std::lock_guard lock(e.mutex);
    auto it = e.cache.find(key);
    if (it == e.cache.end()) {
      // Bounded: a process that sees ever new shapes (a fuzzer, a server with varying token
      // counts) would otherwise keep every primitive. Primitives in use are reference counted.
      if (e.cache.size() >= kMaxPrimitives) e.cache.clear();
      dnnl::post_ops ops;
      if (opt.accumulate) ops.append_sum(1.f);
      if (opt.act) append_activation(ops, *opt.act);
      dnnl::primitive_attr attr;
      attr.set_post_ops(ops);
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const bool dm = opt.dynamic_m, dk = opt.dynamic_k;
      auto create = [&](memory::data_type in_dt) {
        const auto a_rt = matrix_desc(G, M, K, ta, in_dt, dm, dk);
        const auto b_rt = matrix_desc(G, K, N, tb, in_dt, dk, false);
        const auto c_rt = matrix_desc(G, M, N, Trans::no, memory::data_type::f32, dm, false);
        const auto bias_rt = memory::desc({1, N}, memory::data_type::f32, memory::dims{N, 1});
        auto desc = opt.bias ? dnnl::matmul::desc(a_rt, b_rt, bias_rt, c_rt)
                             : dnnl::matmul::desc(a_rt, b_rt, c_rt);
        return dnnl::matmul::primitive_desc(desc, attr, e.engine);
      };
      Entry made;
      auto make = [&](memory::data_type in_dt) {
        const auto pd = create(in_dt);
        made.scratchpad_bytes = pd.scratchpad_desc().get_size();
        made.prim = dnnl::matmul(pd);
      };
      if (bf16 && e.bf16_native) {
        try {
          make(memory::data_type::bf16);
        } catch (const dnnl::error&) {
          // oneDNN has no bf16 product for this CPU (it needs AVX-512 or AMX): from now on
          // bf16 products are emulated exactly, below.
          e.bf16_native = false;
        }
      }
      if (!made.prim) {
        make(memory::data_type::f32);
        made.emulated_bf16 = bf16;
      }
      it = e.cache.emplace(key, made).first;
    }
    entry = it->second;
  }

  // Operands as the primitive reads them. Native bf16: an operand stored in bf16 (weights packed
  // once for inference) as it is, an f32 one converted into per-thread scratch. Emulated bf16:
  // every operand as the f32 values of its bf16 rounding — bf16 products are exact in f32 and
  // the accumulation is f32 either way, so this computes what a bf16 product computes.
  const bool native_bf16 = bf16 && !entry.emulated_bf16;
  auto input = [&](const Tensor& t, int slot) -> const void* {
    if (native_bf16) {
      if (t.dtype() == DType::bf16) return t.bf16();
      std::uint16_t* t16 = scratch<std::uint16_t>(slot, t.numel());
      to_bf16(t16, t.f32(), t.numel());
      return t16;
    }
    if (!bf16) return t.f32();
    float* rounded = scratch<float>(slot, t.numel());
    if (t.dtype() == DType::bf16)
      widen_bf16(rounded, t.bf16(), t.numel());
    else
      round_to_bf16(rounded, t.f32(), t.numel());
    return rounded;
  };
  const auto in_dt = native_bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const auto a_md = matrix_desc(G, M, K, ta, in_dt);
  const auto b_md = matrix_desc(G, K, N, tb, in_dt);
  const auto c_md = matrix_desc(G, M, N, Trans::no, memory::data_type::f32);
  const auto bias_md = memory::desc({1, N}, memory::data_type::f32, memory::dims{N, 1});
  const void* a_ptr = input(a, 0);
  const void* b_ptr = input(b, 1);
  memory a_mem(a_md, e.engine, const_cast<void*>(a_ptr));
  memory b_mem(b_md, e.engine, const_cast<void*>(b_ptr));
  memory c_mem(c_md, e.engine, c.f32());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
  if (opt.bias)
    args.emplace(DNNL_ARG_BIAS, memory(bias_md, e.engine, const_cast<float*>(opt.bias->f32())));
  // This thread's stream and scratchpad (see the top of the file).
  thread_local dnnl::stream stream(e.engine);
  thread_local std::vector<std::byte> scratchpad;
  if (entry.scratchpad_bytes > 0) {
    if (scratchpad.size() < entry.scratchpad_bytes) scratchpad.resize(entry.scratchpad_bytes);
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 memory(memory::desc({static_cast<memory::dim>(entry.scratchpad_bytes)},
                                     memory::data_type::u8, memory::dims{1}),
                        e.engine, scratchpad.data()));
  }
  entry.prim.execute(stream, args);
  stream.wait();
}

}  // namespace ffnlab
