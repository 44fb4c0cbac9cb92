// The study and the language model from Python (docs/python.md):
//   TransformerLM(config=None, seed=1, **keys)    the byte-level LM of `ffnlab train`
//   train(model, data, progress=None, **keys)     trains it; returns its logs as dicts
//                                                 (ffnlab.train wraps it: progress=True)
//   _evolve(options, progress)                    the study (ffnlab.evolve wraps it)
//   _evolve_arguments()                           the options it takes (study::option_rows)
//   _plan(options, cores)                         the study's plan, as `evolve --plan`
// The GIL is released while they work; progress callbacks take it back. Ctrl-C sets the
// library's stop request at once (SigintBridge): the work stops at its next safe point (a child
// such as gnuplot is ended, the study stops before its commit) and KeyboardInterrupt is raised;
// the study's staging folder is removed, an earlier report kept.
#include "ffnlab/study/study.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/layers/transformer_lm.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/train/data.hpp"
#include "ffnlab/train/run.hpp"
#include "ffnlab/train/run_folder.hpp"
#include "ffnlab/train/toy.hpp"
#include "ffnlab/train/train_config.hpp"
#include "ffnlab/train/trainer.hpp"
#include "python.hpp"

namespace ffnlab::python {

namespace {

// Calls a Python progress callback from C++ work that runs without the GIL. A pending Ctrl-C,
// or an exception in the callback, becomes a stop request: the work ends at its next safe point
// and the binding raises what happened once the GIL is back (the callback's own exception, with
// its type and traceback).
class Callback {
 public:
  explicit Callback(py::object fn) : fn_(std::move(fn)) {}

  template <class... Args>
  void operator()(Args&&... args) {
    py::gil_scoped_acquire gil;
    if (interrupted_ || error_) return;
    if (PyErr_CheckSignals() != 0) {  // a signal handler raised: KeyboardInterrupt, or its own
      py::error_already_set raised;
      const bool interrupt = raised.matches(PyExc_KeyboardInterrupt);
      if (!interrupt) error_ = std::move(raised);  // raised as it is, once the work has ended
      stop(interrupt);
      return;
    }
    if (fn_.is_none()) return;
    try {
      fn_(std::forward<Args>(args)...);
    } catch (py::error_already_set& e) {
      const bool interrupt = e.matches(PyExc_KeyboardInterrupt);
      if (!interrupt) error_ = std::move(e);
      stop(interrupt);
    }
  }

  // With the GIL, after the work: forgets the stop request and raises what asked for it.
  // `sigint`: a SIGINT arrived while the work ran (SigintBridge), which Python's handler still
  // holds; running it here raises its KeyboardInterrupt now rather than at some later line.
  // `stopped`: what the work said when it stopped ("stopped after step 40; checkpoint written
  // to run/checkpoint"), the KeyboardInterrupt's message.
  void raise_if_stopped(bool sigint, const std::string& stopped = "") {
    clear_stop();
    const auto keyboard_interrupt = [&] {
      if (stopped.empty())
        PyErr_SetNone(PyExc_KeyboardInterrupt);
      else
        PyErr_SetString(PyExc_KeyboardInterrupt, stopped.c_str());
      throw py::error_already_set();
    };
    if (sigint && PyErr_CheckSignals() != 0) {
      // Python's default handler raises a bare KeyboardInterrupt: it gets the message; another
      // handler's exception is raised as it is.
      if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) throw py::error_already_set();
      PyErr_Clear();
      keyboard_interrupt();
    }
    if (error_) {  // the callback's exception, or a signal handler's own
      error_->restore();
      error_.reset();
      throw py::error_already_set();
    }
    // (A SIGINT whose handler raised nothing still stopped the work: it ended early.)
    if (interrupted_ || sigint) keyboard_interrupt();
  }

 private:
  void stop(bool interrupt) {
    interrupted_ = interrupt;
    request_stop(SIGINT);
  }
  py::object fn_;
  bool interrupted_ = false;
  std::optional<py::error_already_set> error_;
};

// One study, training, plan, toy run or sample at a time in a process: they share its stop request
// (interrupt.hpp). `running_owner` is the thread that holds it, on which the progress callbacks
// run: a call from one of them must not try the lock again.
std::mutex running;
std::atomic<std::thread::id> running_owner{};

// Ctrl-C while the work runs without the GIL. Python's SIGINT handler only marks the signal for
// the main thread's next bytecode, which the work does not reach until it returns: a callback
// could see it at the next progress call, but the study's figures (gnuplot) make none, so a
// Ctrl-C there was noticed after the new report had replaced the earlier one. While the work
// runs, this handler sets the library's stop request at once (async-signal-safe, as the command
// line's), which the work checks at its safe points, gnuplot's wait and before the study's commit,
// and then hands the signal on to Python's handler. Installed only over Python's default
// (signal.default_int_handler, which raises KeyboardInterrupt); a handler of the program's own
// keeps the signal to itself. The previous handler comes back when the work ends.
class SigintBridge {
 public:
  SigintBridge() {
    seen_.store(false);
    const py::module_ signal_module = py::module_::import("signal");
    if (!signal_module.attr("getsignal")(SIGINT).is(signal_module.attr("default_int_handler")))
      return;
    struct sigaction current {};
    if (sigaction(SIGINT, nullptr, &current) != 0) return;
    const bool function = (current.sa_flags & SA_SIGINFO) != 0
                              ? current.sa_sigaction != nullptr
                              : current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN;
    if (!function) return;  // Python's handler is not the one installed (an embedding program)
    python_ = current;
    struct sigaction ours {};
    ours.sa_sigaction = on_sigint;
    ours.sa_mask = current.sa_mask;
    ours.sa_flags = SA_SIGINFO | SA_RESTART | (current.sa_flags & SA_ONSTACK);
    installed_ = sigaction(SIGINT, &ours, nullptr) == 0;
  }
  ~SigintBridge() { restore(); }
  SigintBridge(const SigintBridge&) = delete;
  SigintBridge& operator=(const SigintBridge&) = delete;

  // Puts Python's handler back, unless something else replaced ours meanwhile (a callback that
  // called signal.signal).
  void restore() {
    if (!installed_) return;
    installed_ = false;
    struct sigaction current {};
    if (sigaction(SIGINT, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) != 0 &&
        current.sa_sigaction == on_sigint)
      sigaction(SIGINT, &python_, nullptr);
  }
  // Whether a SIGINT arrived while ours was installed.
  static bool seen() { return seen_.load(); }

 private:
  static void on_sigint(int sig, siginfo_t* info, void* context) {
    const int saved = errno;
    seen_.store(true);
    request_stop(sig);
    errno = saved;
    if ((python_.sa_flags & SA_SIGINFO) != 0)
      python_.sa_sigaction(sig, info, context);
    else
      python_.sa_handler(sig);
  }
  static_assert(std::atomic<bool>::is_always_lock_free);
  static inline std::atomic<bool> seen_{false};
  static inline struct sigaction python_ {};  // written only while `running` is held
  bool installed_ = false;
};

// Runs `work` without the GIL. A stop that Python asked for (Ctrl-C, a failing callback) is
// raised afterwards, also when the work finished before it saw the request; a Ctrl-C is raised
// as KeyboardInterrupt whatever the work did (a child it waited on may have died of the same
// Ctrl-C, sent to the whole process group).
template <class F>
auto run_released(Callback& callback, F&& work) {
  if (running_owner.load() == std::this_thread::get_id())
    throw Error(
        "[python] ffnlab.train, ffnlab.evolve, ffnlab.plan, ffnlab.toy and TransformerLM.sample "
        "cannot be called from the progress callback of another (they share the process's stop "
        "request): call it after that one returns");
  std::unique_lock busy(running, std::try_to_lock);
  if (!busy.owns_lock())
    throw Error(
        "[python] another ffnlab.train, ffnlab.evolve, ffnlab.plan, ffnlab.toy or "
        "TransformerLM.sample is running in this process (they share its stop request); run "
        "them one after the other");
  running_owner.store(std::this_thread::get_id());
  struct Owner {  // cleared before `busy` unlocks
    ~Owner() { running_owner.store(std::thread::id{}); }
  } owner;
  clear_stop();
  SigintBridge bridge;
  std::optional<decltype(work())> result;
  std::exception_ptr failure;
  {
    py::gil_scoped_release release;
    const ChosenThreads threads;
    try {
      result.emplace(work());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  bridge.restore();
  const bool sigint = SigintBridge::seen();
  if (!failure) {
    callback.raise_if_stopped(sigint);
    return std::move(*result);
  }
  try {
    std::rethrow_exception(failure);
  } catch (const Interrupted& e) {
    callback.raise_if_stopped(sigint, e.what());
    clear_stop();
    throw;  // a stop that did not come from Python (no handler of ours asked for it)
  } catch (...) {
    if (sigint) callback.raise_if_stopped(true);
    clear_stop();
    throw;
  }
}

// The study's progress as calls of progress(kind, done, planned, text, eta_seconds), kind one of
// "begin", "message", "step", "end".
class PythonObserver : public study::Observer {
 public:
  explicit PythonObserver(Callback& callback) : callback_(callback) {}
  void begin(std::int64_t planned, const std::string& line) override {
    callback_("begin", 0, planned, line, -1.0);
  }
  void message(const std::string& line) override { callback_("message", 0, 0, line, -1.0); }
  void step(std::int64_t done, std::int64_t planned, const std::string& text, double eta) override {
    callback_("step", done, planned, text, eta);
  }
  void end() override { callback_("end", 0, 0, std::string(), -1.0); }

 private:
  Callback& callback_;
};

// A list of names (variants, sizes, tasks) for `function` (evolve, plan): a list or tuple of
// strings, never a bare string, not empty (None is the default list).
std::vector<std::string> names_argument(std::string_view function, const std::string& key,
                                        const py::handle& v, const std::string& noun,
                                        const std::string& example, const std::string& when_empty) {
  const std::string what = fmt::format("a list of {} names such as {}", noun, example);
  const std::string one = fmt::format("a {} name (a string)", noun);
  if (PyUnicode_Check(v.ptr())) {
    if (PyUnicode_GetLength(v.ptr()) == 0)
      throw py::value_error(fmt::format("[python] {}: {} is empty: {}", function, key, when_empty));
    bad_argument(function, key, what, v);
  }
  if (!PyList_Check(v.ptr()) && !PyTuple_Check(v.ptr())) bad_argument(function, key, what, v);
  std::vector<std::string> names;
  for (const py::handle item : py::reinterpret_borrow<py::sequence>(v)) {
    const std::string which = fmt::format("{}[{}]", key, names.size());
    if (!PyUnicode_Check(item.ptr())) bad_argument(function, which, one, item);
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(item.ptr(), &size);
    if (text == nullptr) {
      PyErr_Clear();
      bad_argument(function, which, one, item);
    }
    names.emplace_back(text, static_cast<std::size_t>(size));
  }
  if (names.empty())
    throw py::value_error(fmt::format("[python] {}: {} is empty: {}", function, key, when_empty));
  return names;
}

std::vector<std::string> variants_argument(std::string_view function, const py::handle& v) {
  // "all", as `--variants all`: every variant of the library.
  if (PyUnicode_Check(v.ptr()) && py::str(v).cast<std::string>() == "all") return variant_names();
  return names_argument(
      function, "variants", v, "variant", "['relu', 'swiglu']",
      fmt::format("give a list of variant names that includes 'relu' (None: the default, {})",
                  fmt::join(study::default_variants(), ", ")));
}

// A model's weights and gradients must fit: refused with a message before the allocation, as
// `ffnlab train` refuses it (train() checks the optimizer's state when it starts).
void check_model_memory(const LMConfig& c) {
  const std::int64_t params = transformer_cost(c, 1).params;
  check_memory(8.0 * static_cast<double>(params), "python",
               fmt::format("a model of {} parameters (weights and gradients)", params));
}

// The LM of a model config (docs/config.md), with two conveniences: `variant` (and optionally
// `d_ff`) names the FFN of every block as `ffnlab train --variant [--d-ff]` builds it
// (train_ffn); without an `ffn` or `variant` the FFN is ReLU of 4·d_model, as there.
LMConfig lm_config_of(const py::object& config, const py::kwargs& keys) {
  nlohmann::json j = config_with_keys(config, keys);
  std::optional<std::string> variant;
  std::int64_t d_ff = 0;
  if (j.contains("variant")) {
    if (!j["variant"].is_string()) throw py::value_error("[python] variant must be a string");
    variant = j["variant"].get<std::string>();
    j.erase("variant");
  }
  if (j.contains("d_ff")) {
    if (!variant) throw py::value_error("[python] d_ff goes with variant (or inside ffn)");
    if (!j["d_ff"].is_number_integer() || j["d_ff"].get<std::int64_t>() <= 0)
      throw py::value_error(
          fmt::format("[python] d_ff must be a positive integer (leave it out for the variant's "
                      "own width), got {}",
                      j["d_ff"].dump()));
    d_ff = j["d_ff"].get<std::int64_t>();
    j.erase("d_ff");
  }
  if (variant && j.contains("ffn")) throw py::value_error("[python] give variant or ffn, not both");
  // The keys `ffnlab train --objective` sets on a new model, but those given here.
  Objective objective = Objective::causal;
  if (j.contains("objective")) {
    if (!j["objective"].is_string())
      throw py::value_error("[python] objective must be a string, causal or masked");
    objective = parse_enum<Objective>(j["objective"].get<std::string>());
    j.erase("objective");
  }
  const GivenModelKeys given = given_model_keys(j);
  const std::int64_t D = j.value("d_model", LMConfig{}.d_model);
  if (!j.contains("ffn")) j["ffn"] = config_to_json(train_ffn(variant.value_or("relu"), D, d_ff));
  LMConfig c;
  try {
    c = lm_config_from_json(j);
  } catch (const Error& e) {  // the config's keys are listed; name this call's own too
    const std::string what = e.what();
    if (!what.starts_with("[lm] unknown key")) throw;  // the model's own keys, not ffn's
    throw Error(what + "; TransformerLM also takes variant, d_ff and objective");
  }
  set_objective_keys(c, objective, given);
  return c;
}

struct LM {
  std::unique_ptr<TransformerLM> lm;
};

// What ffnlab.train hears from its run: the steps and evaluations it returns, and the progress
// it hands to the callback.
class TrainObserver final : public RunObserver {
 public:
  TrainObserver(Callback& callback, std::int64_t steps) : total(steps), callback_(callback) {}
  void started(const RunStart& s, TransformerLM& /*model*/) override {
    done = s.from_step;
    total = s.train.steps;
  }
  void step(const StepLog& s, const TransformerLM& /*model*/) override {
    steps.push_back(s);
    done = s.step;
    callback_("step", s.step, total, fmt::format("step {} loss {:.3f}", s.step, s.loss), -1.0);
  }
  void evaluated(const EvalLog& e) override {
    evals.push_back(e);
    callback_("eval", e.step, total,
              fmt::format("step {}: validation {:.4f} bits/byte", e.step, e.bits_per_byte), -1.0);
  }
  bool stop() override { return stop_requested(); }

  std::vector<StepLog> steps;  // with their per-layer diagnostics
  std::vector<EvalLog> evals;
  std::int64_t done = 0;  // the step the model is at
  std::int64_t total;

 private:
  Callback& callback_;
};

// Sets a KeyboardInterrupt's .log; a failure to (an exception that takes no attribute) never
// hides the interrupt.
void attach_log(py::error_already_set& e, const py::dict& log) {
  try {
    py::setattr(e.value(), "log", log);
  } catch (py::error_already_set&) {
  }
}

py::dict train(const py::object& model_arg, const py::object& data_arg, const py::object& progress,
               const py::object& out_arg, const py::object& resume_arg, const py::object& force_arg,
               const py::object& val_fraction_arg, const py::kwargs& keys) {
  if (!py::isinstance<LM>(model_arg))
    bad_argument("train", "model", "an ffnlab.TransformerLM", model_arg);
  LM& model = model_arg.cast<LM&>();
  RunRequest rq;
  rq.data = path_argument("train", "data", data_arg);
  rq.resume = resume_arg.is_none() ? "" : path_argument("train", "resume", resume_arg);
  // As `ffnlab train --resume DIR` continues in DIR unless --out names another folder.
  rq.out = out_arg.is_none() ? "" : path_argument("train", "out", out_arg);
  rq.force = bool_argument("train", "force", force_arg);
  // None: the default split, or a resumed run's. The range of `--val-fraction`.
  rq.val_fraction_given = !val_fraction_arg.is_none();
  if (rq.val_fraction_given)
    rq.val_fraction =
        real_from_argument("train", "val_fraction", val_fraction_arg, 0.0, 1.0, true,
                           fmt::format("None: {}, or a resumed run's", kDefaultValFraction),
                           /*above_lo=*/true);
  if (!progress.is_none() && !PyCallable_Check(progress.ptr()))
    bad_argument("train", "progress", "None or a callable", progress);
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, value] : keys) {
    const std::string name = py::str(key);
    j[name] = to_json(value, name);
    rq.given.push_back({name, fmt::format("{} = {}", name, j[name].dump())});
  }
  rq.train = train_config_from_json(j);
  rq.names = {"out", "data", "steps =", "val_fraction=", "pass force=True", "resume="};
  // The yardstick of the run's FLOP utilisation (summary.json), as `ffnlab train` measures it,
  // for a run that writes a folder.
  rq.measure_bare = !rq.out.empty() || !rq.resume.empty();
  rq.validate_at_end = true;
  TransformerLM& lm = *model.lm;
  Callback callback(progress);
  TrainObserver observer(callback, rq.train.steps);
  // The steps and evaluations so far, as the result lists them (and a stopped run's
  // KeyboardInterrupt carries them as .log: without a folder they would be lost).
  const auto logs = [&] {
    py::list step_list, eval_list;
    for (const StepLog& s : observer.steps) step_list.append(from_json(to_json(s)));
    for (const EvalLog& e : observer.evals) eval_list.append(from_json(to_json(e)));
    py::dict result;
    result["steps"] = step_list;
    result["evals"] = eval_list;
    return result;
  };
  std::optional<RunOutcome> run;
  try {
    run.emplace(run_released(callback, [&] {
      try {
        RunOutcome outcome = run_training(rq, observer, &lm);
        if (!outcome.finished)
          throw Interrupted(
              fmt::format("stopped after step {}{}", outcome.step,
                          outcome.out.empty() ? "" : "; checkpoint written to " + outcome.out));
        callback("end", outcome.step, outcome.train.steps, std::string(), -1.0);
        return outcome;
      } catch (...) {
        callback("end", observer.done, observer.total, std::string(), -1.0);  // ends the bar's line
        throw;
      }
    }));
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_KeyboardInterrupt)) attach_log(e, logs());
    throw;
  } catch (const Interrupted& stop) {  // a stop Python did not ask for, raised here with .log
    PyErr_SetString(PyExc_KeyboardInterrupt, stop.what());
    py::error_already_set e;
    attach_log(e, logs());
    throw e;
  }
  const RunOutcome& r = *run;
  // A resume given another number of steps that will not equal an uninterrupted run, as
  // `ffnlab train` notes it.
  if (!r.schedule_note.empty() &&
      PyErr_WarnEx(PyExc_UserWarning, ("[train] " + r.schedule_note).c_str(), 1) != 0)
    throw py::error_already_set();
  py::dict result = logs();
  result["validation"] = r.validation ? from_json(to_json(*r.validation)) : py::none();
  result["summary"] = from_json(r.summary);
  return result;
}

// The study's options from `function`'s (evolve's, plan's) arguments, one per row of the
// study's options (`ffnlab evolve`'s flags, by the same rows), each checked by its row.
study::Options study_options(std::string_view function, const py::dict& options) {
  study::Options o;
  o.front_end = study::FrontEnd::python;
  for (const auto& [k, v] : options) {
    const std::string key = py::str(k);
    if (v.is_none()) continue;  // the default
    // An argument per row of the study's options (`ffnlab evolve`'s flags, by the same rows).
    const auto& rows = study::option_rows();
    const auto row = std::find_if(rows.begin(), rows.end(), [&](const study::OptionRow& r) {
      return study::argument_name(r.flag) == key;
    });
    if (row == rows.end())
      throw py::value_error(fmt::format("[python] {} has no option '{}'", function, key));
    using V = study::OptionRow::Value;
    switch (row->value) {
      case V::path:
        o.*std::get<std::string study::Options::*>(row->field) = path_argument(function, key, v);
        break;
      case V::on:
        o.*std::get<bool study::Options::*>(row->field) = bool_argument(function, key, v);
        break;
      case V::count: {  // the range of the flag (0, the library's "default", is None here)
        const std::int64_t n = int_argument(function, key, v, static_cast<std::int64_t>(row->lo),
                                            static_cast<std::int64_t>(row->hi));
        std::visit(
            [&]<class T>(T study::Options::*field) {
              if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
                o.*field = static_cast<T>(n);
              else
                throw std::logic_error("a count row's field is not an integer");
            },
            row->field);
        break;
      }
      case V::real:
        o.*std::get<double study::Options::*>(row->field) =
            real_argument(function, key, v, row->lo, row->hi);
        break;
      case V::names: {  // each list's own example and default, in the messages
        auto& list = o.*std::get<std::vector<std::string> study::Options::*>(row->field);
        if (key == "variants")
          list = variants_argument(function, v);
        else if (key == "sizes") {
          std::vector<std::string_view> ladder;
          for (const study::ModelSize& size : study::size_ladder(false))
            ladder.push_back(size.name);
          list = names_argument(function, key, v, "size", "['xs', 's']",
                                fmt::format("give sizes of the ladder, {} (None: the study's LM "
                                            "alone)",
                                            fmt::join(ladder, ", ")));
        } else if (key == "tasks")
          list = names_argument(
              function, key, v, "task", "['causal', 'masked']",
              fmt::format("give tasks, {} (None: causal)", fmt::join(study::task_names(), ", ")));
        else
          throw std::logic_error("evolve: no Python reading for the list option " + key);
        break;
      }
      case V::duration:
        o.*std::get<double study::Options::*>(row->field) =
            PyUnicode_Check(v.ptr()) ? study::parse_duration(std::string(py::str(v)))
                                     : real_argument(function, key, v, row->lo, row->hi);
        break;
    }
  }
  return o;
}

py::object evolve(const py::dict& options, const py::object& progress) {
  const study::Options o = study_options("evolve", options);
  if (!progress.is_none() && !PyCallable_Check(progress.ptr()))
    bad_argument("evolve", "progress", "None or a callable", progress);
  Callback callback(progress);
  PythonObserver observer(callback);
  const study::Results r = run_released(callback, [&] { return study::run_study(o, observer); });
  return from_json(study::to_json(r));
}

// `ffnlab toy` for one layer (train/toy.hpp): every iteration's loss and gradient norm.
// progress: None or a callable progress(kind, done, planned, text, eta_seconds) ("step" after
// each iteration, "end").
py::list toy(const py::object& config, const py::object& progress, const py::object& batch_arg,
             const py::object& seq_arg, const py::object& dropout_arg, const py::object& lr_arg,
             const py::object& iterations_arg, const py::object& seed_arg, const py::kwargs& keys) {
  ToyConfig t;  // the ranges of `ffnlab toy`'s flags
  t.batch = int_argument("toy", "batch", batch_arg, 1, std::int64_t{1} << 20, false);
  t.seq = int_argument("toy", "seq", seq_arg, 1, std::int64_t{1} << 20, false);
  t.dropout = static_cast<float>(
      real_from_argument("toy", "dropout", dropout_arg, 0.0, 1.0, true, "the tutorial's 0.1"));
  const double lr = finite_argument("toy", "lr", lr_arg);
  // (In single precision too, as `--lr`: 1e-50 would train with a rate of 0.)
  if (!(lr > 0.0 && lr <= 1e30 && static_cast<float>(lr) > 0.0f))
    bad_argument("toy", "lr", "a number in (0, 1e+30]", lr_arg);
  t.lr = static_cast<float>(lr);
  t.iterations =
      static_cast<int>(int_argument("toy", "iterations", iterations_arg, 1, 100000000, false));
  t.seed = seed_argument("toy", seed_arg);
  const FFNConfig c = config_from_json(config_with_keys(config, keys));
  // What the run holds, as `ffnlab toy` checks it, and the log returned: a dict an iteration
  // (about 400 bytes).
  const std::int64_t tokens = t.batch * t.seq;
  check_memory(toy_memory_bytes(c, t) + 400.0 * t.iterations, "python",
               fmt::format("toy: a layer of {} parameters on {} tokens (weights, gradients, "
                           "Adam's state and activations) and the log of {} iterations",
                           count_params(c), tokens, t.iterations));
  if (!progress.is_none() && !PyCallable_Check(progress.ptr()))
    bad_argument("toy", "progress", "None or a callable", progress);
  Callback callback(progress);  // Ctrl-C stops it before the next iteration
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const std::vector<ToyStep> steps = run_released(callback, [&] {
    auto log = run_toy(
        c, t, [] { return stop_requested(); },
        [&](int done, const ToyStep& s) {
          const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
          callback("step", done, t.iterations, fmt::format("loss {:.4f}", s.loss),
                   seconds / done * (t.iterations - done));
        });
    callback("end", t.iterations, t.iterations, std::string(), -1.0);  // ends the bar's line
    return log;
  });
  py::list out;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    py::dict d;
    d["iteration"] = i + 1;
    d["loss"] = steps[i].loss;
    d["grad_norm"] = steps[i].grad_norm;
    out.append(d);
  }
  return out;
}

// `ffnlab evolve --plan`: the study's cost on this machine, timed; nothing is trained or
// written. `cores`: the core counts besides this machine's that the wall time is given for.
py::object plan(const py::dict& options, const py::object& cores_arg) {
  const study::Options o = study_options("plan", options);  // (plan_study fills the variants)
  constexpr std::string_view expected = "a list of core counts such as [8, 64, 512]";
  if (!PyList_Check(cores_arg.ptr()) && !PyTuple_Check(cores_arg.ptr()))
    bad_argument("plan", "cores", expected, cores_arg);
  std::vector<int> cores;
  for (const py::handle c : py::reinterpret_borrow<py::sequence>(cores_arg))
    cores.push_back(static_cast<int>(
        int_argument("plan", fmt::format("cores[{}]", cores.size()), c, 1, 10000000, false)));
  Callback callback{py::none()};  // Ctrl-C: KeyboardInterrupt once the timing ends
  return from_json(run_released(callback, [&] {
    const int workers = omp_get_max_threads();
    return study::plan_to_json(study::plan_study(o, workers), workers, cores);
  }));
}

}  // namespace

void add_study(py::module_& m) {
  py::class_<LM>(m, "TransformerLM", R"(The byte-level Transformer LM of `ffnlab train`.

TransformerLM(config=None, seed=1, **keys): config is the model's JSON config as a dict
(docs/config.md); keys override or add keys of it (a dict merges into the config's).
variant="swiglu" (with d_ff, or the
variant's own width) names the FFN of every block, as `ffnlab train --variant [--d-ff]` builds
it; ffn=ffnlab.study_ffn("swiglu") puts the study's equal-parameter layer there.
objective="masked" sets the keys `ffnlab train --objective masked` sets (causal False, vocab
257, RoPE positions unless given). seed draws the initial weights; `ffnlab train --seed S` uses S for both the weights and the batches, so the same
seed here and in train(seed=S) gives the command's run.)")
      .def(py::init(
               [](const py::object& config, const py::object& seed_arg, const py::kwargs& keys) {
                 const std::uint64_t seed = seed_argument("TransformerLM", seed_arg);
                 const LMConfig c = lm_config_of(config, keys);
                 check_model_memory(c);
                 py::gil_scoped_release release;
                 const ChosenThreads threads;
                 return LM{std::make_unique<TransformerLM>(c, seed)};
               }),
           py::arg("config") = py::none(), py::arg("seed") = 1)
      .def_static(
          "from_run",
          [](const py::object& run_dir) {  // a str or a path-like object
            const std::string dir = path_argument("from_run", "run_dir", run_dir);
            const LMConfig c = read_resume_point(dir).model;
            check_model_memory(c);
            py::gil_scoped_release release;
            const ChosenThreads threads;
            return LM{std::make_unique<TransformerLM>(c, 1)};
          },
          py::arg("run_dir"),
          "A model of the config in a run folder's checkpoint, freshly initialised (seed 1, as "
          "TransformerLM(config=...)): its trained weights and optimizer state are loaded by "
          "train(model, data, resume=run_dir)")
      .def_property_readonly(
          "config", [](const LM& l) { return from_json(lm_config_to_json(l.lm->config())); },
          "the full model config as a dict (every key, defaults filled in)")
      .def_property_readonly(
          "num_params", [](LM& l) { return l.lm->parameters().count(); }, "the values in weights()")
      .def(
          "weights",
          [](LM& l) {
            py::dict out;
            for (const Parameter& p : l.lm->parameters().list()) {
              py::tuple shape(p.shape.size());
              for (std::size_t i = 0; i < p.shape.size(); ++i) shape[i] = p.shape[i];
              out[py::str(p.name)] =
                  py::make_tuple(shape, py::bytes(reinterpret_cast<const char*>(p.value.f32()),
                                                  static_cast<std::size_t>(p.value.nbytes())));
            }
            return out;
          },
          "every parameter by name (Hugging Face names, docs/training.md): (shape, bytes of its "
          "f32 values, row-major, native byte order); e.g. torch.frombuffer(bytearray(b), "
          "dtype=torch.float32).view(shape)")
      .def(
          "sample",
          [](LM& l, const py::object& n_arg, const py::object& prompt_arg,
             const py::object& temperature_arg, const py::object& seed_arg) {
            // The ranges of `ffnlab train --sample --temperature`.
            const std::int64_t n = int_argument("sample", "n", n_arg, 0, 1000000, false);
            if (!PyBytes_Check(prompt_arg.ptr()) && !PyUnicode_Check(prompt_arg.ptr()))
              bad_argument("sample", "prompt", "a str or bytes", prompt_arg);
            const std::string prompt = prompt_arg.cast<std::string>();  // str: UTF-8
            const auto temperature = static_cast<float>(real_from_argument(
                "sample", "temperature", temperature_arg, 0.0, 1000.0, false, "0: greedy"));
            const std::uint64_t seed = seed_argument("sample", seed_arg);
            Callback callback{py::none()};  // Ctrl-C stops it (KeyboardInterrupt)
            const std::string text = run_released(callback, [&] {
              return sample_text(*l.lm, prompt, n, temperature, seed,
                                 [] { return stop_requested(); });
            });
            // The bytes as text, as summary.json holds the command's sample.
            PyObject* s =
                PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
            if (s == nullptr) throw py::error_already_set();  // (memory)
            return py::reinterpret_steal<py::str>(s);
          },
          py::arg("n") = 300, py::arg("prompt") = "\n", py::arg("temperature") = 0.8,
          py::arg("seed") = 1,
          R"(The model's continuation of `prompt` (a str, UTF-8, or bytes): n bytes drawn from
softmax(logits / temperature) (0: greedy), with the random generator seeded by `seed`, as `ffnlab
train --sample n --prompt --temperature` draws the sample after its run with its --seed (the
same model, prompt and seed give the same bytes). Returned as a str (bytes that are not UTF-8
read as U+FFFD, as in summary.json). A causal model's only: a masked model fills bytes in.
Ctrl-C stops it (KeyboardInterrupt).)")
      .def("__repr__", [](LM& l) {
        const LMConfig& c = l.lm->config();
        return fmt::format("<ffnlab.TransformerLM {} layers d_model={} ffn={} params={}>", c.layers,
                           c.d_model, variant_name(c.ffn), l.lm->parameters().count());
      });
  m.def("train", &train, py::arg("model"), py::arg("data"), py::arg("progress") = py::none(),
        py::arg("out") = py::none(), py::arg("resume") = py::none(), py::arg("force") = false,
        py::arg("val_fraction") = py::none(),
        R"(Trains `model` (a TransformerLM, in place) on the text at `data` (a file or a folder;
the last val_fraction of the bytes, None: 10 % or a resumed run's, are the validation part).
Keys are the training settings of docs/config.md (steps, batch, seq, lr, seed, ...).
progress(kind, step, steps, text, eta) is called after every step ("step") and evaluation ("eval"). out: a run folder to write as
`ffnlab train --out` does (logs, checkpoint/, summary.json). resume: a run folder to continue
from (its checkpoint's model must be this model's; settings given here that differ from the
checkpoint's, or other data, need force=True). An out that holds an earlier run is refused
unless it is the resumed run's folder or force=True. Returns {"steps": [...], "evals": [...],
"validation": {...}, "summary": {...}}. Ctrl-C stops after the current step, with a checkpoint
when out is given (KeyboardInterrupt).)");
  m.def(
      "training_batches",
      [](const py::object& data, const py::object& steps_arg, const py::object& batch_arg,
         const py::object& seq_arg, const py::object& seed_arg) {
        // (None is no setting here: every argument has its default in the signature.)
        const std::int64_t steps = int_argument("training_batches", "steps", steps_arg, 0,
                                                limits::kSteps, false),
                           batch = int_argument("training_batches", "batch", batch_arg, 1,
                                                limits::kTokens, false),
                           seq = int_argument("training_batches", "seq", seq_arg, 1, limits::kWidth,
                                              false);
        const std::uint64_t seed = seed_argument("training_batches", seed_arg);
        const std::string path = path_argument("training_batches", "data", data);
        // Every batch is held at once, ids and targets, each a bytes object: refused before
        // the work when they cannot fit (a list the system cannot back ends the interpreter).
        const double bytes = 2.0 * static_cast<double>(steps) * static_cast<double>(batch) *
                             static_cast<double>(seq);
        check_memory(bytes + 80.0 * static_cast<double>(steps), "python",
                     fmt::format("the batches of {} steps ({} bytes of ids and targets a step)",
                                 steps, 2 * batch * seq));
        const Corpus corpus = load_corpus(path, kDefaultValFraction);
        py::list out;
        for (std::int64_t step = 0; step < steps; ++step) {
          if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C
          const Batch b =
              sample_batch(corpus.train(), batch, seq, seed, static_cast<std::uint64_t>(step), 0);
          std::string ids(b.ids.size(), '\0'), targets(b.targets.size(), '\0');
          for (std::size_t i = 0; i < b.ids.size(); ++i) {
            ids[i] = static_cast<char>(b.ids[i]);
            targets[i] = static_cast<char>(b.targets[i]);
          }
          out.append(py::make_tuple(py::bytes(ids), py::bytes(targets)));
        }
        return out;
      },
      py::arg("data"), py::arg("steps"), py::arg("batch") = TrainConfig{}.batch,
      py::arg("seq") = TrainConfig{}.seq, py::arg("seed") = TrainConfig{}.seed,
      "The batches train(model, data, steps=, batch=, seq=, seed=) trains on (one micro-batch a "
      "step): a list of (ids, targets) per step, each batch·seq bytes (row-major [batch, seq]; "
      "targets are the next bytes), so that another framework can train on the same data.");
  m.def(
      "study_ffn",
      [](const py::object& variant, const py::object& d_model) {
        return from_json(config_to_json(study::study_ffn(
            string_argument("study_ffn", "variant", variant),
            int_argument("study_ffn", "d_model", d_model, 1, limits::kWidth, false))));
      },
      py::arg("variant"), py::arg("d_model") = LMConfig{}.d_model,
      "The study's layer of a variant, as a config dict (docs/config.md): the parameters of the "
      "ReLU FFN of 4*d_model, and for MoE its balancing and z-loss coefficients. "
      "TransformerLM(ffn=study_ffn(v, D), d_model=D) is the LM `ffnlab evolve` trains for v.");
  m.def("_evolve", &evolve, py::arg("options"), py::arg("progress") = py::none(),
        "The study (ffnlab.evolve wraps it with a progress bar)");
  m.def("_toy", &toy, py::arg("config"), py::arg("progress"), py::kw_only(), py::arg("batch") = 2,
        py::arg("seq") = 4, py::arg("dropout") = 0.1, py::arg("lr") = 1e-3,
        py::arg("iterations") = 100, py::arg("seed") = 42,
        "The toy run of one layer (ffnlab.toy wraps it with a progress bar)");
  m.def("_plan", &plan, py::arg("options"), py::arg("cores"),
        "The study's plan on this machine (ffnlab.plan wraps it)");
  m.def(
      "_evolve_arguments",
      [] {
        std::vector<std::string> names;
        for (const study::OptionRow& row : study::option_rows())
          names.push_back(study::argument_name(row.flag));
        return names;
      },
      "The arguments _evolve takes, one per option of `ffnlab evolve`'s study (ffnlab.evolve "
      "must take each)");
}

}  // namespace ffnlab::python
