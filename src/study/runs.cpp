// The study's LM runs: trained side by side in threads, handed out to other MPI ranks, or
// taken from the run store (study.hpp's train_runs, serve_runs and RunStore).
//
// Over ranks, rank 0 runs the study and every other rank serves runs (serve_runs): rank 0 sends
// a rank a job, the rank trains it on one thread and sends back its progress and its record,
// and gets the next job when it is done (a work queue, so that long and short runs balance).
// A run trains the same wherever it goes: one OpenMP thread, its seed, the same data.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "check.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/study/study.hpp"
#include "ffnlab/train/run.hpp"
#include "ffnlab/train/step_log.hpp"
#include "json_keys.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

// Seconds spent timing the bare products of a configuration's shapes.
constexpr double kBareProductsSeconds = 0.2;

// Thrown inside a run that stopped because another one failed; never leaves train_runs.
struct Abandoned {};

// What a study run's driver tells it: the job's probe, the pool's progress, and stop when the
// study stops or another run failed.
class JobObserver final : public RunObserver {
 public:
  JobObserver(RunProbe* probe, const std::function<void(const StepLog&)>& progress,
              const std::atomic<bool>& abandon)
      : probe_(probe), progress_(progress), abandon_(abandon) {}
  void started(const RunStart& /*start*/, TransformerLM& model) override {
    if (probe_) probe_->start(model);
  }
  void step(const StepLog& s, const TransformerLM& model) override {
    if (probe_) probe_->step(model, s);
    progress_(s);
  }
  bool stop() override { return stop_requested() || abandon_.load(); }

 private:
  RunProbe* probe_;
  const std::function<void(const StepLog&)>& progress_;
  const std::atomic<bool>& abandon_;
};

std::unique_ptr<RunProbe> make_probe(const Study& st, const RunJob& job) {
  switch (job.probe) {
    case Probe::none:
      return nullptr;
    case Probe::census:
      return census_probe(st, job);
    case Probe::load_trace:
      return load_trace_probe(st, job);
    case Probe::routing_behaviour:
      return routing_behaviour_probe(st, job);
    case Probe::count:
      break;
  }
  fail("[evolve] unknown probe {}", static_cast<int>(job.probe));
}

RunRecord train_one(const Study& st, const RunJob& job,
                    const std::function<void(const StepLog&)>& progress,
                    const std::atomic<bool>& abandon) {
  RunRecord r;
  r.variant = job.label;
  r.seed = static_cast<int>(job.seed);
  r.d_ff = job.model.ffn.kind == FFNKind::moe ? job.model.ffn.expert_d_ff() : job.model.ffn.d_ff;
  RunRequest rq;
  rq.train = job.settings ? *job.settings : st.scale.train;
  rq.train.seed = job.seed;
  rq.corpus = &st.corpus;
  if (const auto bare = st.bare_products.find(job.label); bare != st.bare_products.end())
    rq.bare = bare->second;
  rq.measure_bare = false;  // (timed before the pool: train_runs)
  rq.validate_at_end = true;
  rq.validation_tokens = st.scale.validation_tokens;
  TransformerLM lm(job.model, job.seed);
  r.params = lm.parameters().count();
  const std::unique_ptr<RunProbe> probe = make_probe(st, job);
  JobObserver observer(probe.get(), progress, abandon);
  RunOutcome run = run_training(rq, observer, &lm);
  check_stop();
  if (abandon) throw Abandoned{};
  r.steps = std::move(run.steps);
  r.evals = std::move(run.evaluations);
  r.val_bits_per_byte = run.validation->bits_per_byte;
  if (probe) {
    probe->end(lm);
    r.gathered = probe->gathered();
  }
  r.median_tokens_per_second = run.median_tokens_per_second;
  if (rq.bare) {
    r.bare_products_gflops = run.bare.gflops();
    r.matrix_gflops = run.matrix_gflops;
  }
  return r;
}

std::string pack(const nlohmann::json& j) {
  const std::vector<std::uint8_t> bytes = nlohmann::json::to_cbor(j);
  return {bytes.begin(), bytes.end()};
}

nlohmann::json unpack(const std::string& bytes) {
  return nlohmann::json::from_cbor(bytes);
}

// A message between ranks that does not read as its kind says (nlohmann's error, `e`): the
// ranks' own exchange failed, not the user's input. (So does a message that no rank should have
// sent: each is a system failure, exit 3.)
[[noreturn]] void fail_message(int from, const nlohmann::json::exception& e) {
  fail_system(
      "[evolve] a message from rank {} does not read ({}): every rank must run the same "
      "ffnlab",
      from, json_error_text(e));
}

nlohmann::json products_json(const ModelProducts& p) {
  return {{"flops", p.flops},
          {"seconds", p.seconds},
          {"expert_flops", p.expert_flops},
          {"experts_per_token", p.experts_per_token},
          {"expert_token_flops", p.expert_token_flops},
          {"tokens", p.tokens}};
}

ModelProducts products_of(const nlohmann::json& j) {
  ModelProducts p;
  p.flops = j.at("flops");
  p.seconds = j.at("seconds");
  p.expert_flops = j.at("expert_flops");
  p.experts_per_token = j.at("experts_per_token");
  p.expert_token_flops = j.at("expert_token_flops");
  p.tokens = j.at("tokens");
  return p;
}

// A job message's run, the fingerprint of rank 0's data and the bare products rank 0 timed (none:
// the run times its own), as rank 0 (`from`) wrote them; one that does not read fails as
// fail_message says.
struct JobMessage {
  RunJob job;
  std::string data;
  std::optional<ModelProducts> bare;
};
JobMessage job_message(const nlohmann::json& m, int from) {
  try {
    const nlohmann::json& bare = m.at("bare");
    return {job_from_json(m.at("job")), m.at("data").get<std::string>(),
            bare.is_null() ? std::nullopt : std::optional(products_of(bare))};
  } catch (const nlohmann::json::exception& e) {
    fail_message(from, e);
  }
}

// Rank 0's view of the ranks that serve runs during one train_runs call.
class RemoteRanks {
 public:
  // What a rank told: steps of job `job` done (up to `steps` of it), or its record.
  struct Event {
    std::size_t job;
    int rank;
    std::int64_t new_steps = 0;
    StepLog log;
    std::optional<RunRecord> record;
  };

  RemoteRanks(ProcessGroup& ranks, double timeout) : ranks_(ranks), timeout_(timeout) {
    for (int r = 1; r < ranks.size(); ++r) idle_.push_back(r);
  }
  bool busy() const { return !busy_.empty(); }

  // Hands jobs to the idle ranks while `next()` gives one (a job index, or none). A send that
  // fails (a rank that does not take the run within the timeout) is thrown as its own kind,
  // naming the run (`label(job)`).
  template <typename Next, typename Describe, typename Label>
  void hand_out(Next next, Describe describe, Label label) {
    while (!idle_.empty()) {
      const std::optional<std::size_t> job = next();
      if (!job) return;
      const std::string message = pack(describe(*job));  // (its own errors are not the send's)
      const int r = idle_.front();
      idle_.pop_front();
      busy_[r] = {*job, 0, Clock::now()};
      try {
        ranks_.send(message, r, kJob, "study run");
      } catch (const std::exception& e) {
        Failure::of(e).raise(
            fmt::format("[evolve] rank {} did not take the run '{}': ", r, label(*job)));
      }
    }
  }

  // The messages that have arrived. Throws, for a rank that failed, the error of its failure's
  // kind (a failed write on a rank exits 3 as it would alone); SystemError, as training's own
  // exchanges do, for a rank that has said nothing for `timeout` seconds while it trains
  // (`label(job)` names the run).
  template <typename Label>
  std::vector<Event> poll(Label label) {
    std::vector<Event> out;
    std::string bytes;
    int from = 0, tag = 0;
    while (ranks_.try_receive(bytes, from, tag, "study run")) {
      try {
        const nlohmann::json m = unpack(bytes);
        const auto at = busy_.find(from);
        if (at == busy_.end() || at->second.job != m.at("index").get<std::size_t>())
          fail_system("[evolve] rank {} sent a message about a run it was not given", from);
        Busy& b = at->second;
        b.heard = Clock::now();
        if (tag == kFailed)
          Failure::from_json(m.at("failure"))
              .raise(fmt::format("[evolve] rank {} failed in the run '{}': ", from, label(b.job)));
        Event e{b.job, from, 0, {}, std::nullopt};
        if (tag == kStep) {
          const std::int64_t steps = m.at("steps");
          e.new_steps = steps - b.steps;
          b.steps = steps;
          e.log = step_from_json(m.at("log"));
        } else if (tag == kDone) {
          e.record = record_from_json(m.at("record"));
          e.new_steps = static_cast<std::int64_t>(e.record->steps.size()) - b.steps;
          busy_.erase(at);
          idle_.push_back(from);
        } else {
          fail_system("[evolve] rank {} sent a message of unknown kind {}", from, tag);
        }
        out.push_back(std::move(e));
      } catch (const nlohmann::json::exception& e) {
        fail_message(from, e);
      }
    }
    const auto now = Clock::now();
    for (const auto& [r, b] : busy_)
      if (std::chrono::duration<double>(now - b.heard).count() > timeout_)
        fail_system(
            "[evolve] rank {} has said nothing for {} s while training the run '{}': it has "
            "stopped or hangs (--dist-timeout sets the wait)",
            r, timeout_, label(b.job));
    return out;
  }

  // After a failure: the busy ranks abandon their runs.
  void stop_all() noexcept {
    for (const auto& [r, b] : busy_) {
      try {
        ranks_.send(pack({{"index", b.job}}), r, kStop, "study run");
      } catch (...) {  // the failure being reported matters more
      }
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Busy {
    std::size_t job;
    std::int64_t steps;  // reported so far
    Clock::time_point heard;
  };
  ProcessGroup& ranks_;
  double timeout_;
  std::deque<int> idle_;
  std::map<int, Busy> busy_;
};

}  // namespace

std::vector<RunRecord> train_runs(Study& st, std::vector<RunJob> jobs) {
  std::vector<RunRecord> records(jobs.size());
  if (jobs.empty()) return records;
  // The runs the store kept (a resumed study) are taken as they are; the others train.
  std::vector<nlohmann::json> described(jobs.size());
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (st.store.enabled()) {
      described[i] = job_to_json(st, jobs[i]);
      if (std::optional<RunRecord> kept = st.store.find(described[i])) {
        records[i] = std::move(*kept);
        const std::int64_t steps = static_cast<std::int64_t>(records[i].steps.size());
        st.done_steps += steps;
        st.kept_steps += steps;
        ++st.kept_runs;
        st.message(fmt::format("  {} seed {}: {:.4f} bits/byte (kept in the run store)",
                               jobs[i].label, jobs[i].seed, records[i].val_bits_per_byte));
        continue;
      }
    }
    todo.push_back(i);
  }
  if (todo.empty()) return records;
  // The yardstick of FLOP utilisation, for each configuration that reports it and is not yet
  // timed: its bare products on one thread (as each run trains), before any run of the pool
  // starts.
  for (std::size_t i : todo) {
    const RunJob& job = jobs[i];
    if (!job.utilisation || st.bare_products.contains(job.label)) continue;
    check_stop();
    const TrainConfig tc = job.settings ? *job.settings : st.scale.train;
    ModelProducts bare;
    std::exception_ptr error;
    std::thread([&] {
      omp_set_num_threads(1);
      try {
        bare =
            measure_model_products(job.model, tc.batch, tc.seq, tc.precision, kBareProductsSeconds);
      } catch (...) {
        error = std::current_exception();
      }
    }).join();
    if (error) std::rethrow_exception(error);
    st.bare_products[job.label] = bare;
  }
  // What the runs tell this thread: a step of job `job` done, or the job finished.
  struct Event {
    std::size_t job;
    bool finished;
    StepLog log;
  };
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Event> events;
  std::exception_ptr failure;  // the first, from a run or from the observer
  std::atomic<std::size_t> next{0};
  std::atomic<bool> abandon{false};
  const int workers = static_cast<int>(
      std::clamp<std::size_t>(static_cast<std::size_t>(st.concurrent_runs), 1, todo.size()));
  int running = workers;
  auto fail = [&](std::exception_ptr e) {
    std::lock_guard lock(mutex);
    if (!failure) failure = e;
    abandon = true;
  };
  auto post = [&](Event e) {
    {
      std::lock_guard lock(mutex);
      events.push_back(std::move(e));
    }
    wake.notify_one();
  };
  auto work = [&] {
    omp_set_num_threads(1);  // this thread's runs: one OpenMP thread (and oneDNN on it)
    for (std::size_t n = next++; n < todo.size() && !abandon; n = next++) {
      const std::size_t i = todo[n];
      try {
        records[i] = train_one(
            st, jobs[i],
            [&](const StepLog& s) {
              post({i, false, s});
            },
            abandon);
        post({i, true, {}});
      } catch (const Abandoned&) {
        break;
      } catch (...) {
        fail(std::current_exception());
        break;
      }
    }
    {
      std::lock_guard lock(mutex);
      --running;
    }
    wake.notify_one();
  };

  // The other ranks (under mpirun) take jobs from the same queue as this rank's threads.
  std::optional<RemoteRanks> remote;
  if (st.ranks != nullptr && st.ranks->size() > 1) remote.emplace(*st.ranks, st.rank_timeout);
  auto run_name = [&](std::size_t i) {
    return fmt::format("{} seed {}", jobs[i].label, jobs[i].seed);
  };
  auto next_job = [&]() -> std::optional<std::size_t> {
    if (abandon) return std::nullopt;
    const std::size_t n = next++;
    if (n >= todo.size()) return std::nullopt;
    return todo[n];
  };
  auto describe = [&](std::size_t i) {
    const auto bare = st.bare_products.find(jobs[i].label);
    return nlohmann::json{
        {"index", i},
        {"job", described[i].is_null() ? job_to_json(st, jobs[i]) : described[i]},
        {"data", st.corpus.fingerprint},
        {"bare", bare == st.bare_products.end() ? nlohmann::json() : products_json(bare->second)}};
  };

  const auto t0 = std::chrono::steady_clock::now();
  const double before = st.training_seconds;
  auto finished = [&](std::size_t i, const std::string& where) {
    const RunRecord& r = records[i];
    if (st.store.enabled())
      st.store.put(described[i].is_null() ? job_to_json(st, jobs[i]) : described[i], r);
    st.message(fmt::format("  {}: {:.4f} bits/byte, {:.0f} tokens/s{}", run_name(i),
                           r.val_bits_per_byte, r.median_tokens_per_second, where));
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back(work);
  // This thread tells the observer (which may be Python's, or throw) what the runs did, and
  // (over ranks) hands out jobs and hears from the other ranks between looks.
  std::unique_lock lock(mutex);
  for (;;) {
    auto ready = [&] { return !events.empty() || running == 0; };
    if (remote)
      wake.wait_for(lock, std::chrono::milliseconds(2), ready);
    else
      wake.wait(lock, ready);
    std::deque<Event> told;
    told.swap(events);
    const bool threads_done = running == 0;
    lock.unlock();
    try {
      st.training_seconds =
          before + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (const Event& e : told) {
        if (!e.finished)
          st.step_done(e.log, run_name(e.job));
        else
          finished(e.job, "");
      }
      if (remote && !abandon) {
        remote->hand_out(next_job, describe, run_name);
        for (RemoteRanks::Event& e : remote->poll(run_name)) {
          if (e.new_steps > 0) st.step_done(e.log, run_name(e.job), e.new_steps);
          if (e.record) {
            records[e.job] = std::move(*e.record);
            finished(e.job, fmt::format(" (rank {})", e.rank));
          }
        }
      }
    } catch (...) {
      fail(std::current_exception());
    }
    lock.lock();
    if (threads_done && events.empty() && (!remote || abandon || !remote->busy())) break;
  }
  lock.unlock();
  for (auto& t : threads) t.join();
  if (failure) {
    if (remote) remote->stop_all();
    std::rethrow_exception(failure);
  }
  return records;
}

void serve_runs(const Options& options, ProcessGroup& ranks) {
  check(ranks.rank() > 0, "[evolve] rank 0 runs the study; the other ranks serve its runs");
  Study st;
  st.options = options;
  st.options.variants = study_variants(options);
  st.scale = make_scale(st.options);
  st.corpus = load_corpus(options.data, kDefaultValFraction);
  omp_set_num_threads(1);  // each run trains on one thread, as in rank 0's pool
  using Clock = std::chrono::steady_clock;
  std::string bytes;
  int from = 0, tag = 0;
  // Waits for the next message from rank 0, sleeping between looks (rank 0 may be timing or
  // drawing for minutes between its pools).
  auto receive = [&] {
    auto nap = std::chrono::microseconds(50);
    while (!ranks.try_receive(bytes, from, tag, "study run")) {
      check_stop();
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(20000));
    }
  };
  for (;;) {
    receive();
    if (tag == kFinish) return;
    if (tag == kStop) continue;  // about a run this rank had finished already
    if (tag != kJob)
      fail_system("[evolve] rank {}: an unknown message {} from rank {}", ranks.rank(), tag, from);
    nlohmann::json m;
    std::size_t index = 0;
    bool exchange_failed = false;
    try {
      m = unpack(bytes);
      index = m.at("index");
    } catch (const nlohmann::json::exception& e) {
      fail_message(from, e);
    }
    try {
      const JobMessage given = job_message(m, from);
      const RunJob& job = given.job;
      check(given.data == st.corpus.fingerprint,
            "rank {} reads other data than rank 0 ({} against {}): give every rank the same "
            "--data",
            ranks.rank(), st.corpus.fingerprint, given.data);
      if (job_to_json(st, job) != m.at("job"))
        fail_system(
            "the run '{}' does not read back as it was written: every rank must run the "
            "same ffnlab",
            job.label);
      if (given.bare) st.bare_products[job.label] = *given.bare;
      std::atomic<bool> abandon{false};
      // A message to or from rank 0 that fails ends this rank, not the run alone: a send that
      // timed out may still be in flight, reading a buffer that is gone.
      auto exchange = [&exchange_failed](auto&& talk) {
        try {
          return talk();
        } catch (...) {
          exchange_failed = true;
          throw;
        }
      };
      std::int64_t steps = 0;
      auto last = Clock::now();
      auto progress = [&](const StepLog& s) {
        ++steps;
        const bool last_step = job.settings && s.step == job.settings->steps;
        if (last_step || Clock::now() - last > std::chrono::milliseconds(250)) {
          const std::string message =
              pack({{"index", index}, {"steps", steps}, {"log", nlohmann::json(to_json(s))}});
          exchange([&] { ranks.send(message, 0, kStep, "study run"); });
          last = Clock::now();
        }
        std::string stop;
        int stop_from = 0, stop_tag = 0;
        if (exchange([&] { return ranks.try_receive(stop, stop_from, stop_tag, "study run"); })) {
          if (stop_tag != kStop) {  // the ranks' messages are out of step: this rank ends
            exchange_failed = true;
            fail_system("[evolve] rank {}: message {} while training", ranks.rank(), stop_tag);
          }
          abandon = true;
        }
      };
      const RunRecord r = train_one(st, job, progress, abandon);
      const std::string message = pack({{"index", index}, {"record", record_to_json(r)}});
      exchange([&] { ranks.send(message, 0, kDone, "study run"); });
    } catch (const Abandoned&) {
      continue;
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      if (exchange_failed) throw;
      ranks.send(pack({{"index", index}, {"failure", Failure::of(e).to_json()}}), 0, kFailed,
                 "study run");
    }
  }
}

void release_ranks(ProcessGroup& ranks) {
  for (int r = 1; r < ranks.size(); ++r)
    ranks.send(pack(nlohmann::json::object()), r, kFinish, "study end");
}

}  // namespace ffnlab::study
