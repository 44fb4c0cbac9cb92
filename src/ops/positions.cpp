// Sinusoidal table and rotary embeddings. The angles are computed in double once per call
// (seq × dh/2 values), then each row is rotated in place.
#include "ffnlab/ops/positions.hpp"

#include <cmath>
#include <vector>

#include "check.hpp"

namespace ffnlab {

Tensor sinusoidal_table(std::int64_t seq, std::int64_t d_model) {
  Tensor t({seq, d_model});
  float* p = t.f32();
  for (std::int64_t s = 0; s < seq; ++s)
    for (std::int64_t i = 0; i < d_model; i += 2) {
      const double angle =
          static_cast<double>(s) / std::pow(10000.0, static_cast<double>(i) / d_model);
      p[s * d_model + i] = static_cast<float>(std::sin(angle));
      if (i + 1 < d_model) p[s * d_model + i + 1] = static_cast<float>(std::cos(angle));
    }
  return t;
}

namespace {

void rope(Tensor& x, std::int64_t seq, std::int64_t width, std::int64_t dh, float theta,
          float sign) {
  check(dh % 2 == 0 && width % dh == 0 && x.rank() == 2 && x.dim(1) >= width && seq > 0 &&
            x.dim(0) % seq == 0,
        "[rope] head_dim {} (must be even) and width {} do not fit x {} with sequences of {}", dh,
        width, shape_string(x.shape()), seq);
  const std::int64_t half = dh / 2, T = x.dim(0), stride = x.dim(1);
  std::vector<float> cos_t(static_cast<std::size_t>(seq * half)), sin_t(cos_t.size());
  for (std::int64_t s = 0; s < seq; ++s)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle =
          static_cast<double>(s) * std::pow(static_cast<double>(theta), -2.0 * i / dh);
      cos_t[s * half + i] = static_cast<float>(std::cos(angle));
      sin_t[s * half + i] = sign * static_cast<float>(std::sin(angle));
    }
  float* xp = x.f32();
#pragma omp parallel for schedule(static) if (T * width > 65536)
  for (std::int64_t t = 0; t < T; ++t) {
    const float* c = cos_t.data() + (t % seq) * half;
    const float* s = sin_t.data() + (t % seq) * half;
    for (std::int64_t h0 = 0; h0 < width; h0 += dh) {
      float* a = xp + t * stride + h0;
      float* b = a + half;
#pragma omp simd
      for (std::int64_t i = 0; i < half; ++i) {
        const float ai = a[i], bi = b[i];
        a[i] = ai * c[i] - bi * s[i];
        b[i] = bi * c[i] + ai * s[i];
      }
    }
  }
}

}  // namespace

void rope_forward(Tensor& x, std::int64_t seq, std::int64_t width, std::int64_t head_dim,
                  float theta) {
  rope(x, seq, width, head_dim, theta, 1.f);
}

void rope_backward(Tensor& dx, std::int64_t seq, std::int64_t width, std::int64_t head_dim,
                   float theta) {
  rope(dx, seq, width, head_dim, theta, -1.f);
}

}  // namespace ffnlab
