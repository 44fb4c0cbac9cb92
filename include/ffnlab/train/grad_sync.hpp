// GradientSync: sums a model's gradient buffer over a process group (data parallelism) in
// buckets started while backward still runs. TransformerLM::backward reports the gradients as
// they finish, back to front (ready(i): elements [i, end) are complete); each report starts the
// sum of the finished part once it holds a bucket's worth, and lets the sums already started
// advance; finish() starts what is left and waits for everything.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ffnlab/parallel/group.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab {

class GradientSync {
 public:
  // `grads`: the whole flat gradient buffer (f32), summed in place, except the element ranges
  // [begin, end) of `skip` (sorted; expert parallelism: each expert's gradient has one holder).
  GradientSync(ProcessGroup& group, Tensor grads, std::int64_t bucket_elements,
               std::vector<std::pair<std::int64_t, std::int64_t>> skip = {});

  void ready(std::int64_t first);  // elements [first, end) are final
  void finish();                   // everything: started, then waited for

 private:
  void start(std::int64_t from, std::int64_t to);

  ProcessGroup& group_;
  Tensor grads_;
  std::int64_t bucket_;
  std::vector<std::pair<std::int64_t, std::int64_t>> skip_;
  std::int64_t started_from_;  // [started_from_, end) is summed or being summed
};

}  // namespace ffnlab
