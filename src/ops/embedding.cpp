// Token and position embeddings. The table gradients are sums over tokens; they run over column
// blocks in token order, so that they are the same for any thread count.
#include "ffnlab/ops/embedding.hpp"

#include <algorithm>
#include <cstring>

#include "check.hpp"

namespace ffnlab {

namespace {
constexpr std::int64_t kColumnBlock = 32;
}

void embedding_forward(Tensor& y, std::span<const std::int32_t> ids, const Tensor& table) {
  check(table.rank() == 2, "[embedding] table must be [V, D], got {}",
        shape_string(table.shape()));
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), V = table.dim(0),
                     D = table.dim(1);
  for (std::int32_t id : ids)
    check(id >= 0 && id < V, "[embedding] token id {} outside the vocabulary [0, {})", id, V);
  y.ensure({T, D});
  const float* tp = table.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static) if (T * D > 65536)
  for (std::int64_t t = 0; t < T; ++t)
    std::memcpy(yp + t * D, tp + ids[t] * D, static_cast<std::size_t>(D) * sizeof(float));
}

void embedding_backward(Tensor& dtable, const Tensor& dy, std::span<const std::int32_t> ids) {
  const std::int64_t T = dy.dim(0), D = dy.dim(1);
  const std::int64_t blocks = (D + kColumnBlock - 1) / kColumnBlock;
  const float* gp = dy.f32();
  float* dp = dtable.f32();
#pragma omp parallel for schedule(static) if (T * D > 65536)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t d0 = blk * kColumnBlock, d1 = std::min(D, d0 + kColumnBlock);
    for (std::int64_t t = 0; t < T; ++t) {
      float* row = dp + ids[t] * D;
      const float* g = gp + t * D;
#pragma omp simd
      for (std::int64_t d = d0; d < d1; ++d) row[d] += g[d];
    }
  }
}

void position_add_forward(Tensor& y, const Tensor& table, std::int64_t seq) {
  check(y.rank() == 2 && table.rank() == 2 && table.dim(1) == y.dim(1) && seq > 0 &&
            y.dim(0) % seq == 0 && table.dim(0) >= seq,
        "[positions] {} positions of width {} for {} tokens in sequences of {}", table.dim(0),
        table.dim(1), y.dim(0), seq);
  const std::int64_t T = y.dim(0), D = y.dim(1);
  const float* tp = table.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static) if (T * D > 65536)
  for (std::int64_t t = 0; t < T; ++t) {
    const float* row = tp + (t % seq) * D;
#pragma omp simd
    for (std::int64_t d = 0; d < D; ++d) yp[t * D + d] += row[d];
  }
}

void position_add_backward(Tensor& dtable, const Tensor& dy, std::int64_t seq) {
  const std::int64_t T = dy.dim(0), D = dy.dim(1), B = T / seq;
  const float* gp = dy.f32();
  float* dp = dtable.f32();
#pragma omp parallel for schedule(static) if (T * D > 65536)
  for (std::int64_t s = 0; s < seq; ++s)
    for (std::int64_t b = 0; b < B; ++b) {
      const float* g = gp + (b * seq + s) * D;
#pragma omp simd
      for (std::int64_t d = 0; d < D; ++d) dp[s * D + d] += g[d];
    }
}

}  // namespace ffnlab
