// Bucketed, overlapped gradient all-reduce.
#include "ffnlab/train/grad_sync.hpp"

#include <algorithm>

#include "check.hpp"
#include "ranges.hpp"

namespace ffnlab {

GradientSync::GradientSync(ProcessGroup& group, Tensor grads, std::int64_t bucket_elements,
                           std::vector<std::pair<std::int64_t, std::int64_t>> skip)
    : group_(group),
      grads_(grads),
      bucket_(bucket_elements),
      skip_(std::move(skip)),
      started_from_(grads.numel()) {
  check(bucket_elements > 0, "[dist] bucket of {} elements", bucket_elements);
}

void GradientSync::start(std::int64_t from, std::int64_t to) {
  for_each_outside(from, to, skip_, [&](std::int64_t b, std::int64_t e) {
    group_.start_allreduce_sum({grads_.f32() + b, static_cast<std::size_t>(e - b)}, "gradient");
  });
}

void GradientSync::ready(std::int64_t first) {
  first = std::clamp<std::int64_t>(first, 0, started_from_);
  if (started_from_ - first >= bucket_ || (first == 0 && started_from_ > 0)) {
    start(first, started_from_);
    started_from_ = first;
  }
  group_.progress();
}

void GradientSync::finish() {
  ready(0);
  group_.wait_all();
  started_from_ = grads_.numel();
}

}  // namespace ffnlab
