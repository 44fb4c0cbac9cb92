// Expert parallelism's dispatch and combine: counts by MPI-style all-to-all, rows by all-to-allv,
// and the local reorder between "by source rank" and "by expert".
#include "ffnlab/layers/expert_exchange.hpp"

#include <cstring>

#include "check.hpp"

namespace ffnlab {

void ExpertExchange::plan(ProcessGroup& group, const std::vector<std::int64_t>& offsets,
                          int experts) {
  group_ = &group;
  ranks_ = group.size();
  const HeldExperts mine = held_by_rank(experts, ranks_, group.rank());
  per_rank_ = mine.count;
  first_ = mine.first;
  local_rows_ = offsets[experts];
  // counts[q·n + i]: rows this rank sends to expert i of rank q.
  std::vector<std::int64_t> send(static_cast<std::size_t>(experts)), recv(send.size());
  for (int e = 0; e < experts; ++e) send[e] = offsets[e + 1] - offsets[e];
  group.alltoall(send, recv, "expert counts");
  // recv[s·n + i]: rows rank s sends to this rank's expert i.
  send_rows_.assign(ranks_, 0);
  recv_rows_.assign(ranks_, 0);
  for (int q = 0; q < ranks_; ++q)
    send_rows_[q] = offsets[(q + 1) * per_rank_] - offsets[q * per_rank_];
  here_offsets_.assign(per_rank_ + 1, 0);
  for (int i = 0; i < per_rank_; ++i) {
    std::int64_t n = 0;
    for (int s = 0; s < ranks_; ++s) n += recv[s * per_rank_ + i];
    here_offsets_[i + 1] = here_offsets_[i] + n;
  }
  order_.clear();
  std::vector<std::int64_t> next(here_offsets_.begin(), here_offsets_.end() - 1);
  std::vector<std::int64_t> before(per_rank_, 0);  // rows from lower ranks, per expert
  for (int s = 0; s < ranks_; ++s)
    for (int i = 0; i < per_rank_; ++i) {
      const std::int64_t n = recv[s * per_rank_ + i];
      recv_rows_[s] += n;
      for (std::int64_t k = 0; k < n; ++k) order_.push_back(next[i] + before[i] + k);
      before[i] += n;
    }
}

void ExpertExchange::set_counts(std::int64_t width, bool to_holders) {
  const auto& out = to_holders ? send_rows_ : recv_rows_;
  const auto& in = to_holders ? recv_rows_ : send_rows_;
  counts_send_.resize(ranks_);
  counts_recv_.resize(ranks_);
  for (int q = 0; q < ranks_; ++q) {
    counts_send_[q] = out[q] * width;
    counts_recv_[q] = in[q] * width;
  }
}

void ExpertExchange::dispatch(Tensor& here, const Tensor& local) {
  const std::int64_t W = local.dim(1);
  check(local.dim(0) == local_rows_, "[moe] {} rows to dispatch, planned {}", local.dim(0),
        local_rows_);
  set_counts(W, true);
  const std::int64_t R = rows_here();
  wire_.resize(static_cast<std::size_t>(R * W));
  // The local rows are already in expert order, hence in owner order: sent as they are.
  group_->alltoallv(local.f32(), counts_send_, wire_.data(), counts_recv_, "expert dispatch");
  here.ensure({R, W});
  float* out = here.f32();
  for (std::int64_t i = 0; i < R; ++i)
    std::memcpy(out + order_[i] * W, wire_.data() + i * W, static_cast<std::size_t>(W) * 4);
}

void ExpertExchange::combine(Tensor& local, const Tensor& here) {
  const std::int64_t W = here.dim(1), R = rows_here();
  check(here.dim(0) == R, "[moe] {} rows to combine, planned {}", here.dim(0), R);
  set_counts(W, false);
  wire_.resize(static_cast<std::size_t>(R * W));
  const float* in = here.f32();
  for (std::int64_t i = 0; i < R; ++i)
    std::memcpy(wire_.data() + i * W, in + order_[i] * W, static_cast<std::size_t>(W) * 4);
  local.ensure({local_rows_, W});
  group_->alltoallv(wire_.data(), counts_send_, local.f32(), counts_recv_, "expert combine");
}

}  // namespace ffnlab
