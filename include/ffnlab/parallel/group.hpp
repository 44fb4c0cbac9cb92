// ProcessGroup: the processes that train one model together (data parallelism), as the layers
// and the trainer see them. The library itself holds no MPI: ffnlab/parallel/mpi.hpp implements
// this interface over MPI when ffnlab is built with FFNLAB_MPI (docs/distributed.md).
//
// Every call is collective: every rank of the group makes the same calls in the same order,
// and each returns the same result on every rank. `what` names the exchange in errors (a
// timeout, a rank that stopped).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace ffnlab {

// Expert parallelism: rank q of P holds experts [q·E/P, (q+1)·E/P), E/P each. The one place this
// rule and its check live (the exchange, the trainer's memory and refresh use it).
struct HeldExperts {
  int first = 0;  // the first expert this rank holds
  int count = 0;  // how many (E/P)
};
// Error "[dist] E experts cannot be split evenly over P ranks (expert parallelism)" unless P
// divides E.
HeldExperts held_by_rank(int experts, int ranks, int rank);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // The ranks of this group that pass the same `color`, as a group of their own, ranked in this
  // group's order (expert groups and their replicas). Its collectives involve only them.
  virtual std::unique_ptr<ProcessGroup> split(int color, const char* what) = 0;

  // values = Σ over ranks, in place: measured quantities (losses, norms, statistics).
  virtual void allreduce_sum(std::span<double> values, const char* what) = 0;
  // Counts, flags and hashes travel as 64-bit integers, exact at any size:
  // values = Σ (min, max) over ranks, in place.
  virtual void allreduce_sum(std::span<std::int64_t> values, const char* what) = 0;
  virtual void allreduce_min(std::span<std::int64_t> values, const char* what) = 0;
  virtual void allreduce_max(std::span<std::int64_t> values, const char* what) = 0;
  // values = Σ over ranks below this one (zeros on rank 0), in place.
  virtual void exscan_sum(std::span<std::int64_t> values, const char* what) = 0;
  // bytes = rank 0's bytes on every rank (any length; a configuration, an error message).
  virtual void broadcast(std::string& bytes, const char* what) = 0;
  // values = rank `root`'s values on every rank.
  virtual void broadcast(std::span<float> values, int root, const char* what) = 0;

  // Expert parallelism. alltoall: block q of `send` (send.size() / size() counts) goes to rank
  // q, and block q of `recv` comes from rank q. alltoallv: send_counts[q] floats from `send`
  // (consecutive, in rank order) go to rank q; recv_counts[q] floats from rank q land in `recv`,
  // in rank order.
  virtual void alltoall(std::span<const std::int64_t> send, std::span<std::int64_t> recv,
                        const char* what) = 0;
  virtual void alltoallv(const float* send, std::span<const std::int64_t> send_counts, float* recv,
                         std::span<const std::int64_t> recv_counts, const char* what) = 0;

  // Gradient buckets: starts Σ over ranks of `values` in place, without waiting; progress()
  // lets started sums advance (call it while computing); wait_all() returns when every started
  // sum is done.
  virtual void start_allreduce_sum(std::span<float> values, const char* what) = 0;
  virtual void progress() = 0;
  virtual void wait_all() = 0;

  // Point to point, for work handed out rank by rank (the study's runs over ranks): send()
  // hands `bytes` to rank `to` under `tag` and returns once they are on their way (the deadline
  // applies); try_receive() takes the next message that has arrived from any rank, if any
  // (false: none yet), and says from which rank and under which tag. Only the thread that
  // created the group calls them. A group without them (the default) throws Error.
  virtual void send(const std::string& bytes, int to, int tag, const char* what);
  virtual bool try_receive(std::string& bytes, int& from, int& tag, const char* what);

  // The exchanges from now on may wait `seconds` beyond the group's deadline (0: none again),
  // for long work that one rank does alone while the others wait for its result (rank 0's
  // checkpoint write). A group without a deadline ignores it.
  virtual void set_extra_wait(double seconds) { (void)seconds; }

  // Bytes of payload this process handed to collectives since construction (the vectors above,
  // not MPI's own traffic, which depends on its algorithm), and the seconds spent inside them
  // (waiting for the other ranks included): what docs/distributed.md's model is checked against.
  virtual double payload_bytes() const = 0;
  virtual double seconds_in_collectives() const = 0;
  // payload_bytes() and the seconds by exchange (`what`): {what, {bytes, seconds}}.
  virtual std::map<std::string, std::pair<double, double>> by_exchange() const = 0;
};

}  // namespace ffnlab
