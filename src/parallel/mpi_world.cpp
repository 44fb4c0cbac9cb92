// ProcessGroup over MPI_COMM_WORLD: non-blocking collectives waited for with a deadline.
#include <mpi.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "ffnlab/parallel/mpi.hpp"

namespace ffnlab {

bool mpi_available() {
  return true;
}

namespace {

using Clock = std::chrono::steady_clock;

class World final : public MpiWorld {
 public:
  explicit World(double timeout) : timeout_(timeout) {
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) {
      int provided = 0;
      // One thread calls MPI (the one that runs the trainer); OpenMP threads never do.
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        fail_system("[dist] MPI_Init_thread failed");
      owns_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    world_rank_ = rank_;
    world_size_ = size_;
    // A duplicate of the world, so that its error handler is ours alone. Duplicating is
    // collective: non-blocking, with the deadline, like every exchange (a rank that never
    // arrives must not hang the others here either).
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Request r;
    ok(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &r), "MPI_Comm_idup", "start-up");
    wait(r, "start-up");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }

  // A group of some of the world's ranks (split): the communicator is its own; MPI stays the
  // world's to finalise.
  World(double timeout, MPI_Comm comm, std::shared_ptr<std::string> broken)
      : timeout_(timeout), broken_(std::move(broken)), comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  }

  ~World() override {
    // After a failed exchange MPI may still be running it (a collective cannot be cancelled):
    // freeing its communicator or finalising could wait for it forever. The process's end
    // (or abort()) is what ends it.
    if (!broken_->empty()) return;
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  int ranks_on_this_node() override {
    // MPI_Comm_split_type has no non-blocking form: an exchange with the deadline first, as in
    // split().
    std::vector<std::int64_t> here{1};
    allreduce_sum(here, "ranks on a node");
    MPI_Comm node = MPI_COMM_NULL;
    ok(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
       "MPI_Comm_split_type", "ranks on a node");
    int n = 1;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    return n;
  }

  std::unique_ptr<ProcessGroup> split(int color, const char* what) override {
    // MPI_Comm_split has no non-blocking form: an exchange with the deadline first, so that a
    // rank that never arrives makes the others fail instead of hanging in the split.
    std::vector<std::int64_t> here{1};
    allreduce_sum(here, what);
    MPI_Comm comm = MPI_COMM_NULL;
    ok(MPI_Comm_split(comm_, color, rank_, &comm), "MPI_Comm_split", what);
    return std::make_unique<World>(timeout_, comm, broken_);
  }

  void allreduce_sum(std::span<double> v, const char* what) override {
    allreduce(v.data(), v.size(), v.size_bytes(), MPI_DOUBLE, MPI_SUM, what);
  }
  void allreduce_sum(std::span<std::int64_t> v, const char* what) override {
    allreduce(v.data(), v.size(), v.size_bytes(), MPI_INT64_T, MPI_SUM, what);
  }
  void allreduce_min(std::span<std::int64_t> v, const char* what) override {
    allreduce(v.data(), v.size(), v.size_bytes(), MPI_INT64_T, MPI_MIN, what);
  }
  void allreduce_max(std::span<std::int64_t> v, const char* what) override {
    allreduce(v.data(), v.size(), v.size_bytes(), MPI_INT64_T, MPI_MAX, what);
  }
  void exscan_sum(std::span<std::int64_t> v, const char* what) override {
    usable(what);
    std::vector<std::int64_t> in(v.begin(), v.end());
    MPI_Request r;
    ok(MPI_Iexscan(in.data(), v.data(), count(v.size()), MPI_INT64_T, MPI_SUM, comm_, &r),
       "MPI_Iexscan", what);
    count_bytes(what, static_cast<double>(v.size_bytes()));
    wait(r, what);
    if (rank_ == 0) std::fill(v.begin(), v.end(), 0);  // MPI leaves rank 0's undefined
  }
  void broadcast(std::string& text, const char* what) override {
    usable(what);
    unsigned long long n = text.size();
    MPI_Request r;
    ok(MPI_Ibcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, comm_, &r), "MPI_Ibcast", what);
    wait(r, what);
    text.resize(static_cast<std::size_t>(n));
    ok(MPI_Ibcast(text.data(), count(text.size()), MPI_CHAR, 0, comm_, &r), "MPI_Ibcast", what);
    count_bytes(what, static_cast<double>(n + sizeof n));
    wait(r, what);
  }
  void broadcast(std::span<float> v, int root, const char* what) override {
    usable(what);
    MPI_Request r;
    ok(MPI_Ibcast(v.data(), count(v.size()), MPI_FLOAT, root, comm_, &r), "MPI_Ibcast", what);
    count_bytes(what, rank_ == root ? static_cast<double>(v.size_bytes()) : 0.0);
    wait(r, what);
  }
  void send(const std::string& bytes, int to, int tag, const char* what) override {
    usable(what);
    MPI_Request r;
    ok(MPI_Isend(bytes.data(), count(bytes.size()), MPI_CHAR, to, tag, comm_, &r), "MPI_Isend",
       what);
    count_bytes(what, static_cast<double>(bytes.size()));
    wait(r, what);
  }
  bool try_receive(std::string& bytes, int& from, int& tag, const char* what) override {
    usable(what);
    int arrived = 0;
    MPI_Message message;
    MPI_Status status;
    ok(MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &arrived, &message, &status), "MPI_Improbe",
       what);
    if (!arrived) return false;
    int n = 0;
    ok(MPI_Get_count(&status, MPI_CHAR, &n), "MPI_Get_count", what);
    bytes.resize(static_cast<std::size_t>(n));
    // Non-blocking, waited for with the deadline: a sender that stops mid-message must not
    // hang this rank.
    MPI_Request r;
    ok(MPI_Imrecv(bytes.data(), n, MPI_CHAR, &message, &r), "MPI_Imrecv", what);
    wait(r, what);
    from = status.MPI_SOURCE;
    tag = status.MPI_TAG;
    return true;
  }
  void alltoall(std::span<const std::int64_t> send, std::span<std::int64_t> recv,
                const char* what) override {
    usable(what);
    const int n = count(send.size() / static_cast<std::size_t>(size_));
    MPI_Request r;
    ok(MPI_Ialltoall(send.data(), n, MPI_INT64_T, recv.data(), n, MPI_INT64_T, comm_, &r),
       "MPI_Ialltoall", what);
    count_bytes(what, static_cast<double>(send.size_bytes()));
    wait(r, what);
  }
  void alltoallv(const float* send, std::span<const std::int64_t> send_counts, float* recv,
                 std::span<const std::int64_t> recv_counts, const char* what) override {
    usable(what);
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    std::int64_t so = 0, ro = 0;
    for (int q = 0; q < size_; ++q) {
      sc[q] = count(static_cast<std::size_t>(send_counts[q]));
      rc[q] = count(static_cast<std::size_t>(recv_counts[q]));
      sd[q] = count(static_cast<std::size_t>(so));
      rd[q] = count(static_cast<std::size_t>(ro));
      so += send_counts[q];
      ro += recv_counts[q];
    }
    MPI_Request r;
    ok(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT,
                      comm_, &r),
       "MPI_Ialltoallv", what);
    count_bytes(what, static_cast<double>(so - send_counts[rank_]) * sizeof(float));  // leaves
    wait(r, what);
  }

  void start_allreduce_sum(std::span<float> v, const char* what) override {
    usable(what);
    MPI_Request r;
    ok(MPI_Iallreduce(MPI_IN_PLACE, v.data(), count(v.size()), MPI_FLOAT, MPI_SUM, comm_, &r),
       "MPI_Iallreduce", what);
    count_bytes(what, static_cast<double>(v.size_bytes()));
    pending_.push_back(r);
    pending_what_ = what;
  }
  void progress() override {
    if (pending_.empty()) return;
    usable(pending_what_);
    const auto t0 = Clock::now();
    int done = 0;
    ok(MPI_Testall(static_cast<int>(pending_.size()), pending_.data(), &done, MPI_STATUSES_IGNORE),
       "MPI_Testall", pending_what_);
    if (done) pending_.clear();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    seconds_ += seconds;
    by_what_[pending_what_].second += seconds;
  }
  void wait_all() override {
    if (!pending_.empty()) usable(pending_what_);
    for (MPI_Request& r : pending_) wait(r, pending_what_);
    pending_.clear();
  }

  void set_extra_wait(double seconds) override { extra_ = std::max(0.0, seconds); }
  double payload_bytes() const override { return payload_; }
  double seconds_in_collectives() const override { return seconds_; }
  std::map<std::string, std::pair<double, double>> by_exchange() const override { return by_what_; }

  void abort(int code) noexcept override { MPI_Abort(MPI_COMM_WORLD, code); }

 private:
  static int count(std::size_t n) {
    check(n <= static_cast<std::size_t>(INT32_MAX), "[dist] {} values in one exchange", n);
    return static_cast<int>(n);
  }

  // This rank in messages: its rank in the job (the one mpirun and the other ranks' lines
  // name), and in a group of some ranks its place there too.
  std::string who() const {
    if (size_ == world_size_) return fmt::format("rank {} of {}", world_rank_, world_size_);
    return fmt::format("rank {} of {} (rank {} of the {} of its group)", world_rank_, world_size_,
                       rank_, size_);
  }

  void ok(int rc, const char* call, const char* what) const {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    broke(fmt::format("[dist] {}: {} ({}) failed: {}", who(), call, what, std::string(text, len)));
  }

  void allreduce(void* values, std::size_t n, std::size_t bytes, MPI_Datatype type, MPI_Op op,
                 const char* what) {
    usable(what);
    MPI_Request r;
    ok(MPI_Iallreduce(MPI_IN_PLACE, values, count(n), type, op, comm_, &r), "MPI_Iallreduce", what);
    count_bytes(what, static_cast<double>(bytes));
    wait(r, what);
  }

  void count_bytes(const char* what, double bytes) {
    payload_ += bytes;
    by_what_[what].first += bytes;
  }

  // Polls until done: spinning briefly, then sleeping in growing steps (up to 1 ms), so that a
  // waiting rank leaves the cores to the ranks still computing. Throws after the deadline.
  void wait(MPI_Request& r, const char* what) {
    const auto t0 = Clock::now();
    const double patience = timeout_ + extra_;
    const auto deadline = t0 + std::chrono::duration<double>(patience);
    auto nap = std::chrono::microseconds(1);
    for (int polls = 0;; ++polls) {
      int done = 0;
      ok(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test", what);
      if (done) break;
      const auto now = Clock::now();
      if (now > deadline)
        broke(fmt::format(
            "[dist] {}: no answer from the other ranks for {} s in the {} exchange; a rank has "
            "stopped or hangs (--dist-timeout sets the wait)",
            who(), patience, what));
      if (polls > 100) {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    seconds_ += seconds;
    by_what_[what].second += seconds;
  }

  // An exchange failed (its message; empty: none): MPI may still run it, into memory that is
  // gone, and a next exchange would pair with it. The world and the groups split from it share
  // this; each refuses every exchange after it.
  [[noreturn]] void broke(std::string message) const {
    if (broken_->empty()) *broken_ = message;
    throw SystemError(std::move(message));
  }
  void usable(const char* what) const {
    if (!broken_->empty())
      fail_system(
          "[dist] {}: the {} exchange cannot start: an earlier one failed ({}), and MPI may still "
          "be running it; this process can exchange no more",
          who(), what, *broken_);
  }

  double timeout_, extra_ = 0;
  std::shared_ptr<std::string> broken_ = std::make_shared<std::string>();
  bool owns_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, world_rank_ = 0, world_size_ = 1;
  std::vector<MPI_Request> pending_;
  const char* pending_what_ = "";
  double payload_ = 0, seconds_ = 0;
  std::map<std::string, std::pair<double, double>> by_what_;
};

}  // namespace

std::unique_ptr<MpiWorld> mpi_world(double timeout_seconds) {
  check(timeout_seconds > 0, "[dist] timeout = {} s must be positive", timeout_seconds);
  return std::make_unique<World>(timeout_seconds);
}

}  // namespace ffnlab
