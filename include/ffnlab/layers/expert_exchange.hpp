// ExpertExchange: the two all-to-alls of expert parallelism. The E experts of an MoE layer are
// split over the ranks of a group in equal contiguous shares (rank q owns experts
// [q·E/P, (q+1)·E/P)). Each rank routes its own tokens; dispatch sends every kept row to the
// rank that owns its expert and gathers the rows this rank's experts must process, expert by
// expert (from every rank, in rank order); combine sends the experts' output rows back to where
// their tokens are. Backward uses the same pair the other way round: dispatch for the output
// gradients, combine for the input gradients. Collective (every rank of the group).
#pragma once

#include <cstdint>
#include <vector>

#include "ffnlab/parallel/group.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab {

class ExpertExchange {
 public:
  // The rows per expert that this rank sends (offsets [E + 1] of its permuted buffer, expert
  // blocks in order); exchanges the counts (one all-to-all of E values).
  void plan(ProcessGroup& group, const std::vector<std::int64_t>& offsets, int experts);

  int first_expert() const { return first_; }
  // The blocks of this rank's E/P experts in the rows it receives: [E/P + 1].
  const std::vector<std::int64_t>& offsets() const { return here_offsets_; }
  std::int64_t rows_here() const { return here_offsets_.back(); }

  // local [R, W] (this rank's permuted rows) → here [rows_here(), W] (its experts' rows).
  void dispatch(Tensor& here, const Tensor& local);
  // here [rows_here(), W] → local [R, W]: each row back to its token's rank and place.
  void combine(Tensor& local, const Tensor& here);

 private:
  // Floats per rank for rows of `width`: to the experts' holders (dispatch) or back (combine).
  void set_counts(std::int64_t width, bool to_holders);

  ProcessGroup* group_ = nullptr;
  int ranks_ = 1, per_rank_ = 0, first_ = 0;
  std::int64_t local_rows_ = 0;
  std::vector<std::int64_t> send_rows_, recv_rows_;  // [P] rows to / from each rank
  std::vector<std::int64_t> here_offsets_;           // [E/P + 1]
  // Row i of the received buffer (rank order, then expert) is row order_[i] of `here`
  // (expert order, then rank).
  std::vector<std::int64_t> order_;
  std::vector<float> wire_;  // the received (or to-be-sent) rows in rank order
  std::vector<std::int64_t> counts_send_, counts_recv_;  // floats per rank
};

}  // namespace ffnlab
