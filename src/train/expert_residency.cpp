// Expert parallelism's memory: a rank keeps the weights, gradients and optimizer moments of its
// own experts (expert_share) and gives the pages of the others' back to the system; a refresh
// brings every expert back on every rank (before a checkpoint, at the end).
#include "expert_residency.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include "ffnlab/train/trainer.hpp"

namespace ffnlab {

// The elements of one MoE layer's experts (s.experts equal slices) that the experts of `share`
// occupy: [begin, end).
std::pair<std::int64_t, std::int64_t> held_range(const TransformerLM::ExpertSpan& s,
                                                 const ExpertShare& share) {
  const std::int64_t per_expert = (s.end - s.begin) / s.experts;
  return {s.begin + share.first * per_expert, s.begin + (share.first + share.count) * per_expert};
}

namespace {

// Gives the whole pages inside the ranges back to the system (their values become zeros, and
// cost no memory until written again).
void release(Tensor& buffer, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const auto& [b, e] : ranges) {
    const auto first = reinterpret_cast<std::uintptr_t>(buffer.f32() + b);
    const auto last = reinterpret_cast<std::uintptr_t>(buffer.f32() + e);
    const std::uintptr_t from = (first + page - 1) / page * page, to = last / page * page;
    if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
  }
}

}  // namespace

void Trainer::release_foreign_experts(ExpertState what) {
  if (foreign_.empty() || step_ >= config_.steps) return;  // at the end, every rank keeps all
  release(model_.parameters().values(), foreign_);
  release(model_.parameters().grads(), foreign_);
  if (what == ExpertState::with_moments) {
    release(optimizer_->m(), foreign_);
    if (optimizer_->v().defined()) release(optimizer_->v(), foreign_);
  }
}

void Trainer::refresh_experts(ExpertState what) {
  if (expert_spans_.empty()) return;
  ProcessGroup& g = expert_group();  // holds every expert once (each replica the same)
  auto refresh = [&](Tensor& buffer) {
    for (const auto& s : expert_spans_)
      for (int q = 0; q < g.size(); ++q) {  // rank q's experts, from rank q
        const auto [begin, end] = held_range(s, expert_share(s.experts, g.size(), q));
        g.broadcast({buffer.f32() + begin, static_cast<std::size_t>(end - begin)}, q,
                    "expert refresh");
      }
  };
  refresh(model_.parameters().values());
  if (what == ExpertState::with_moments) {
    refresh(optimizer_->m());
    if (optimizer_->v().defined()) refresh(optimizer_->v());
  }
}

}  // namespace ffnlab
