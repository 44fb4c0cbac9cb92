// ThreadGroup: a ProcessGroup of N threads in one process, for testing data parallelism without
// MPI (and under the sanitizers). Each collective puts every rank's values in a shared slot,
// waits for all, combines them in rank order, and waits again before the slots are reused.
// Point-to-point messages go to a mailbox per rank, read in the order they were sent (one order
// over all senders; MPI keeps the order only per sender).
// run(n, body) starts n threads, body(group_of_rank), and rethrows the first exception.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "ffnlab/error.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/parallel/group.hpp"

namespace ffnlab::test {

class ThreadGroup final : public ProcessGroup {
 public:
  struct Shared {
    explicit Shared(int n)
        : size(n), barrier(n), slots(n), texts(n), floats(n), counts(n), mail(n) {}
    int size;
    std::barrier<> barrier;
    std::vector<std::vector<double>> slots;
    std::vector<std::string> texts;
    std::vector<std::vector<float>> floats;
    std::vector<std::vector<std::int64_t>> counts;
    std::map<int, std::shared_ptr<Shared>> children;  // split: the new groups by color
    struct Message {
      std::string bytes;
      int from, tag;
    };
    std::mutex mail_lock;
    std::vector<std::deque<Message>> mail;  // each rank's, oldest first
  };

  ThreadGroup(Shared& shared, int rank, std::shared_ptr<Shared> owned = nullptr)
      : owned_(std::move(owned)), s_(shared), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return s_.size; }

  std::unique_ptr<ProcessGroup> split(int color, const char*) override {
    s_.counts[rank_].assign(1, color);
    s_.barrier.arrive_and_wait();
    int new_rank = 0;
    if (rank_ == 0) {  // one thread makes the new groups' shared state
      s_.children.clear();
      std::map<int, int> sizes;
      for (int q = 0; q < s_.size; ++q) ++sizes[static_cast<int>(s_.counts[q][0])];
      for (const auto& [c, n] : sizes) s_.children[c] = std::make_shared<Shared>(n);
    }
    for (int q = 0; q < rank_; ++q) new_rank += s_.counts[q][0] == color;
    s_.barrier.arrive_and_wait();
    auto child = s_.children.at(color);
    s_.barrier.arrive_and_wait();  // every rank has its group before children is reused
    return std::make_unique<ThreadGroup>(*child, new_rank, child);
  }

  void allreduce_sum(std::span<double> v, const char*) override {
    combine(v, std::plus<>(), s_.size);
  }
  void allreduce_sum(std::span<std::int64_t> v, const char*) override {
    combine(v, std::plus<>(), s_.size);
  }
  void allreduce_min(std::span<std::int64_t> v, const char*) override {
    combine(
        v, [](auto a, auto b) { return std::min(a, b); }, s_.size);
  }
  // Called with the exchange's name as this rank enters allreduce_max (null: nothing): a test
  // does something on one rank at a given point of the others' work.
  std::function<void(const std::string&)> on_allreduce_max;
  void allreduce_max(std::span<std::int64_t> v, const char* what) override {
    if (on_allreduce_max) on_allreduce_max(what);
    combine(
        v, [](auto a, auto b) { return std::max(a, b); }, s_.size);
  }
  void exscan_sum(std::span<std::int64_t> v, const char*) override {
    combine(v, std::plus<>(), rank_, true);
  }
  void broadcast(std::string& text, const char*) override {
    s_.texts[rank_] = text;
    s_.barrier.arrive_and_wait();
    text = s_.texts[0];
    s_.barrier.arrive_and_wait();
  }
  void broadcast(std::span<float> v, int root, const char*) override {
    s_.floats[rank_].assign(v.begin(), v.end());
    s_.barrier.arrive_and_wait();
    std::copy(s_.floats[root].begin(), s_.floats[root].end(), v.begin());
    s_.barrier.arrive_and_wait();
  }
  void alltoall(std::span<const std::int64_t> send, std::span<std::int64_t> recv,
                const char*) override {
    const std::size_t n = send.size() / static_cast<std::size_t>(s_.size);
    s_.counts[rank_].assign(send.begin(), send.end());
    s_.barrier.arrive_and_wait();
    for (int q = 0; q < s_.size; ++q)
      std::copy_n(s_.counts[q].begin() + rank_ * n, n, recv.begin() + q * n);
    s_.barrier.arrive_and_wait();
  }
  void alltoallv(const float* send, std::span<const std::int64_t> send_counts, float* recv,
                 std::span<const std::int64_t> recv_counts, const char*) override {
    std::int64_t total = 0;
    for (auto c : send_counts) total += c;
    s_.floats[rank_].assign(send, send + total);
    s_.counts[rank_].assign(send_counts.begin(), send_counts.end());
    s_.barrier.arrive_and_wait();
    std::int64_t at = 0;
    for (int q = 0; q < s_.size; ++q) {
      std::int64_t from = 0;  // where q's block for this rank starts in q's buffer
      for (int p = 0; p < rank_; ++p) from += s_.counts[q][p];
      EXPECT_EQ(s_.counts[q][rank_], recv_counts[q]) << "rank " << rank_ << " from " << q;
      std::copy_n(s_.floats[q].begin() + from, recv_counts[q], recv + at);
      at += recv_counts[q];
    }
    s_.barrier.arrive_and_wait();
  }
  // Summed at once (the order of calls is the same on every rank, which is all it needs).
  void start_allreduce_sum(std::span<float> v, const char*) override {
    std::vector<double> d(v.begin(), v.end());
    allreduce_sum(d, "");
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(d[i]);
    ++buckets_;
    gradient_elements_ += static_cast<std::int64_t>(v.size());
  }
  // A send of this tag fails as a timed-out exchange would (-1: none), before it is delivered.
  int failing_send_tag = -1;
  void send(const std::string& bytes, int to, int tag, const char*) override {
    if (tag == failing_send_tag)
      throw SystemError(fmt::format("[dist] the send of message {} failed", tag), ETIMEDOUT);
    std::lock_guard lock(s_.mail_lock);
    s_.mail.at(to).push_back({bytes, rank_, tag});
  }
  bool try_receive(std::string& bytes, int& from, int& tag, const char*) override {
    std::lock_guard lock(s_.mail_lock);
    auto& box = s_.mail[rank_];
    if (box.empty()) return false;
    bytes = std::move(box.front().bytes);
    from = box.front().from;
    tag = box.front().tag;
    box.pop_front();
    return true;
  }
  // What set_extra_wait was given, in order (the group has no deadline to extend).
  std::vector<double> extra_waits;
  void set_extra_wait(double seconds) override { extra_waits.push_back(seconds); }
  void progress() override {}
  void wait_all() override {}
  double payload_bytes() const override { return 0; }
  double seconds_in_collectives() const override { return 0; }
  std::map<std::string, std::pair<double, double>> by_exchange() const override { return {}; }
  int buckets() const { return buckets_; }
  std::int64_t gradient_elements() const { return gradient_elements_; }  // all buckets' sizes

  static void run(int n, const std::function<void(ThreadGroup&)>& body) {
    Shared shared(n);
    std::vector<std::thread> threads;
    std::exception_ptr error;
    std::mutex m;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        ThreadGroup g(shared, r);
        try {
          body(g);
        } catch (...) {
          std::lock_guard lock(m);
          if (!error) error = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    if (error) std::rethrow_exception(error);
  }

  // What each of n ranks ended with: `done` when body returned, else its failure as "kind errno
  // message" (Failure::of), the line tests of failures that cross ranks compare.
  static std::vector<std::string> outcomes(int n, const std::function<void(ThreadGroup&)>& body,
                                           const std::string& done) {
    std::vector<std::string> lines(n);
    run(n, [&](ThreadGroup& g) {
      try {
        body(g);
        lines[g.rank()] = done;
      } catch (const std::exception& e) {
        const Failure f = Failure::of(e);
        lines[g.rank()] =
            fmt::format("{} {} {}", static_cast<int>(f.kind), f.error_number, f.message);
      }
    });
    return lines;
  }

 private:
  // values = op over ranks [0, upto) in rank order (upto = size: all; exscan: those below).
  template <class T, class Op>
  void combine(std::span<T> v, Op op, int upto, bool zero_if_none = false) {
    auto& slots = slots_of<T>();
    slots[rank_].assign(v.begin(), v.end());
    s_.barrier.arrive_and_wait();
    for (std::size_t i = 0; i < v.size(); ++i) {
      T acc = upto > 0 ? slots[0][i] : (zero_if_none ? T{0} : v[i]);
      for (int r = 1; r < upto; ++r) acc = op(acc, slots[r][i]);
      v[i] = acc;
    }
    s_.barrier.arrive_and_wait();
  }
  template <class T>
  std::vector<std::vector<T>>& slots_of() {
    if constexpr (std::is_same_v<T, double>)
      return s_.slots;
    else
      return s_.counts;
  }

  std::shared_ptr<Shared> owned_;  // a group made by split keeps its shared state alive
  Shared& s_;
  int rank_;
  int buckets_ = 0;
  std::int64_t gradient_elements_ = 0;
};

}  // namespace ffnlab::test
