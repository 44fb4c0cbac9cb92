// The kernel dispatch thresholds: every place where an op changes its path with the size of its
// work, in one table. Each row names the benchmark command that measures it; docs/benchmarks.md
// ("Dispatch thresholds") has what they measured, on which CPUs, and which were set without a
// measurement. Change a row only with that command's numbers, before and after, in one run.
#pragma once

#include <cstdint>

namespace ffnlab::dispatch {

// The product library: every product that does not stream (below) is oneDNN's, on every ISA. A
// choice fixed per ISA, not a measurement at start-up, because a product's sums are ordered by its
// library: choosing by a timing would let two runs of one configuration compute different
// values. `bench_libraries` compares oneDNN with Debian's OpenBLAS and BLIS in one process
// (a layer's forward, input- and weight-gradient products at 1600, 2048 and 6400 rows); a row
// for another library is added only where it wins by more than 5 % there. Measured: Zen 3
// (AVX2), where neither does (docs/benchmarks.md, "The product library"), except OpenBLAS on
// input gradients below kConvMinRows rows, where oneDNN's 1x1 convolution is as fast (the next
// row; "Products as a 1x1 convolution on AVX2"). Not yet measured on an AVX-512 CPU.

// Products of at least this many rows run as oneDNN's 1x1 convolution instead of its matmul where
// oneDNN's f32 products are not 512-bit (matmul_conv_min_rows): an f32 product c = a · op(b) with
// a read as stored, as every forward and input-gradient product of a layer is. oneDNN 2.6's AVX2
// 1x1 convolution kernel outruns its AVX2 GEMM there, b's reorder into the kernel's layout
// included; weight gradients (a read transposed) stay matmuls: oneDNN's 1x1 backward-weights
// kernel ran them at 0.52-0.91x its matmul, and its reorders of a transposed a cost what its
// forward kernel gains (docs/benchmarks.md, the gated FFN at 6400 tokens). docs/benchmarks.md
// ("Dispatch thresholds", "Products as a 1x1 convolution on AVX2") has the Zen 3 measurements:
// forward products lost as a convolution at 128 rows, input gradients won from 128; 512 leaves a
// margin. Not used on AVX-512 CPUs, where it is not measured. `bench_libraries --tokens
// 128,256,512,1024,6400`, `bench_ffn --conv-rows 0,512`.
inline constexpr std::int64_t kConvMinRows = 512;

// Few-row products (ops/few_rows): up to this many rows an f32 product streams the weights
// through the dot kernels instead of going to oneDNN: a product of so few rows is bound by
// reading its weights. `bench_few_rows`.
inline constexpr std::int64_t kFewRowsMax = 8;

// Weights up to this many elements (1 MiB of f32: an L2's worth) stream up to kFewRowsMax
// rows on every CPU: oneDNN's fixed costs do not pay off on them. Above it, where oneDNN's f32
// products are 512-bit (matmul_f32_512_bit), the kernels take 1 row forward and 2 backward.
// `bench_few_rows`.
inline constexpr std::int64_t kFewRowsSmallWeight = std::int64_t{1} << 18;
inline constexpr std::int64_t kFewRowsWideMaxForward = 1, kFewRowsWideMaxBackward = 2;

// A bf16 copy of the weights (an inference forward's) streams up to kFewRowsMax rows, except
// where oneDNN's bf16 products are native and the rows have a fixed shape (a dense layer's; an
// MoE's expert blocks would take oneDNN's run-time-M products, which the kernels beat at 2-5
// rows on every shape measured): an up projection of kFewRowsBf16DeepInputs inputs or more and
// kFewRowsBf16LargeWeight elements or more then streams up to kFewRowsBf16LargeMax rows, and
// more rows take oneDNN's fixed-shape bf16 products. `bench_few_rows --weights bf16` (Zen 5,
// 12 shapes: with 2048 inputs or more the kernels ran at 0.76-1.13x oneDNN's speed at 4 rows
// and slower on every shape from 6, 0.51-0.93x; with 512 or 1024 inputs they were faster at
// 3-6 rows, by up to 2.8x, so such layers keep the kernels). The 2^20-element floor is the
// smallest weight measured (2048x512).
inline constexpr std::int64_t kFewRowsBf16DeepInputs = 2048;
inline constexpr std::int64_t kFewRowsBf16LargeWeight = std::int64_t{1} << 20;
inline constexpr std::int64_t kFewRowsBf16LargeMax = 3;

// Weight elements below which one thread computes a whole few-row product (a fork costs more
// than the work). Not measured; `bench_few_rows` on small shapes would.
inline constexpr std::int64_t kFewRowsSerialElements = std::int64_t{1} << 15;

// An f32 product of at most kFewRowsMax rows that does not stream takes oneDNN's run-time-M
// primitive at up to this many rows, or on weights up to kRuntimeMMaxWeight elements; a
// fixed-shape primitive otherwise. `bench_few_rows` (its oneDNN columns).
inline constexpr std::int64_t kRuntimeMMaxRows = 3;
inline constexpr std::int64_t kRuntimeMMaxWeight = std::int64_t{1} << 23;

// Products whose rows vary from call to call (an MoE's expert blocks) run as fixed-shape
// products: M rounded down to a multiple of max(kVaryingRowsMinQuantum, 2^⌊log2 M⌋ /
// kVaryingRowsShapesPerDoubling), then the rest the same way: at most that many shapes per
// doubling of M, each primitive created once. oneDNN's run-time-M primitive is slower than a
// fixed one at these sizes. `bench_matmul`.
inline constexpr std::int64_t kVaryingRowsMinQuantum = 16;
inline constexpr std::int64_t kVaryingRowsShapesPerDoubling = 8;

// Rows from which training products read weights packed in oneDNN's own layout (the reorder
// costs more than it saves below), where oneDNN's f32 products are 512-bit (matmul_f32_512_bit:
// AVX-512, unless ONEDNN_MAX_CPU_ISA caps oneDNN below it). Elsewhere weights are never packed:
// on Zen 3 (AVX2) the packed layout ran within noise of the plain one at 6400 rows, so each
// weight's two packed copies were memory and reorders for nothing.
// `bench_ffn --variants relu,swiglu --pack-rows 0,512`, `bench_packed`.
inline constexpr std::int64_t kPackingMinRows = 4096;

// Tensors of at least this many bytes take a mapping of their own advised for transparent huge
// pages (huge_page_min_bytes): a 2 MiB page is one TLB entry where 4 KiB pages are 512, and a
// layer's products stream through tens of MiB of activations and weights. Below it a tensor
// shares the allocator's pages; the value itself is not measured against others (a tensor of
// it holds at least two huge pages). On Zen 3 (AVX2), forward+backward at 6400 tokens against
// no huge pages, in two runs: medians 0.99-1.11x, within the noise of single rounds
// (0.61-1.31x). Not measured on AVX-512. `bench_ffn --tokens 6400 --huge-pages-mib 0,4`.
inline constexpr std::int64_t kHugePageMinBytes = std::int64_t{4} << 20;

// Elementwise kernels (activations, their backward, the GLU mix): elements per OpenMP chunk,
// so that a thread's work dwarfs the fork. Not measured; `bench_kernels` would.
inline constexpr std::int64_t kElementwiseGrain = std::int64_t{1} << 14;

// Row permutations (MoE dispatch and combine): rows per OpenMP chunk. Not measured; `bench_moe`
// would.
inline constexpr std::int64_t kPermuteRows = 64;

}  // namespace ffnlab::dispatch
