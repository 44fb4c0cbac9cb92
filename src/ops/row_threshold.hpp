// A row count from which a product takes some path (weights packed, products as a convolution),
// chosen by the CPU on first read and changeable for benchmarks.
#pragma once

#include <atomic>
#include <cstdint>

namespace ffnlab {

// Resolved on first read rather than when the library loads: asking oneDNN its instruction set
// fixes it, and a program may still cap it (dnnl::set_max_cpu_isa) before its first product.
// 0 means never.
class RowThreshold {
 public:
  // `resolve` gives the CPU's default; it may run on two threads at once, giving the same value.
  template <typename Resolve>
  std::int64_t get(Resolve resolve) {
    std::int64_t rows = rows_.load(std::memory_order_relaxed);
    if (rows == kUnresolved) {
      const std::int64_t resolved = resolve();
      rows_.compare_exchange_strong(rows, resolved, std::memory_order_relaxed);
      rows = rows_.load(std::memory_order_relaxed);
    }
    return rows;
  }

  // Any rows <= 0 mean never; stored as 0, since kUnresolved means "the default, not yet asked".
  void set(std::int64_t rows) { rows_.store(rows < 0 ? 0 : rows, std::memory_order_relaxed); }

 private:
  static constexpr std::int64_t kUnresolved = -1;
  std::atomic<std::int64_t> rows_{kUnresolved};
};

}  // namespace ffnlab
