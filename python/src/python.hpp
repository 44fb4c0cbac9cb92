// What the extension's source files share: JSON to and from Python objects, and the bindings
// each file adds to the module.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ffnlab::python {

namespace py = pybind11;

// A Python object (dict, list, tuple, str, int, float, bool, None; numpy scalars too) as JSON.
// What JSON cannot hold is a ValueError of one line naming the key, e.g. "[config] key
// 'swish_beta' must be a finite number, got nan": NaN and infinities, integers beyond 64 bits,
// dict keys that are not strings, other types. `key` names obj itself (nested keys are joined
// with '.', list items as key[i]); empty: obj is the whole config.
nlohmann::json to_json(const py::handle& obj, const std::string& key = "");
// A Python value for a one-line message: its repr, cut short, line breaks escaped.
std::string shown(const py::handle& value);
// Whether value is a numpy scalar of `kind` ("integer", "floating", "bool_"); false when numpy
// is not loaded (then no value is one).
bool numpy_scalar(const py::handle& value, const char* kind);
// A config dict (None: empty) with keyword arguments laid over it: a keyword replaces the
// config's key, except that a dict merges into the config's dict of that key, as deep as they
// go (moe={"top_k": 4} changes top_k alone). A dict that names a variant or a kind replaces
// the config's (it is another layer); one that changes the routing drops the keys that routing
// sets, which take its defaults. A config that is not a dict is a ValueError.
nlohmann::json config_with_keys(const py::object& config, const py::kwargs& keys);
// JSON as Python objects (dicts, lists, numbers, strings).
py::object from_json(const nlohmann::json& j);
py::object from_json(const nlohmann::ordered_json& j);

// arguments.cpp: an argument of the API checked, or a ValueError of one line naming the
// function, the argument, what it must be and the value given.
[[noreturn]] void bad_argument(std::string_view function, std::string_view name,
                               std::string_view expected, const py::handle& value);
// True or False (numpy's bool too).
bool bool_argument(std::string_view function, std::string_view name, const py::handle& v);
// An integer in [lo, hi]: a Python int or numpy's, never a bool. none_is_default: the message
// says that None gives the default (the caller skips None).
std::int64_t int_argument(std::string_view function, std::string_view name, const py::handle& v,
                          std::int64_t lo, std::int64_t hi, bool none_is_default = true);
// A random seed: an integer in [0, 2^64 - 1], as `--seed` takes (numpy's too), never a bool.
std::uint64_t seed_argument(std::string_view function, const py::handle& v);
// A finite real number in (lo, hi]: an int or a float (numpy's too), never a bool.
double real_argument(std::string_view function, std::string_view name, const py::handle& v,
                     double lo, double hi);
// A finite real number in [lo, hi], or [lo, hi) when `below_hi`, (lo, ...] when `above_lo`;
// `note` ends the message ("None: the default", "0: greedy").
double real_from_argument(std::string_view function, std::string_view name, const py::handle& v,
                          double lo, double hi, bool below_hi, std::string_view note,
                          bool above_lo = false);
// Any finite number.
double finite_argument(std::string_view function, std::string_view name, const py::handle& v);
// A path: a str or an os.PathLike (bytes too), not empty, without NUL characters.
std::string path_argument(std::string_view function, std::string_view name, const py::handle& v);
// A str.
std::string string_argument(std::string_view function, std::string_view name, const py::handle& v);

// The OpenMP threads set_threads() chose (none chosen: OpenMP's default), on the calling thread
// for this object's life. omp_set_num_threads sets the calling thread's count alone, so every
// call that runs the library's work holds one, with the GIL released: a forward from a
// threading.Thread or an executor's worker runs with the chosen threads too. The thread's own
// count (what PyTorch's ops there use: one OpenMP runtime) is back when the call returns.
class ChosenThreads {
 public:
  ChosenThreads();
  ~ChosenThreads();
  ChosenThreads(const ChosenThreads&) = delete;
  ChosenThreads& operator=(const ChosenThreads&) = delete;
  static void choose(int n);

 private:
  int before_ = 0;  // the thread's count to restore; 0: unchanged
};

// study.cpp: TransformerLM, train, _evolve.
void add_study(py::module_& m);

}  // namespace ffnlab::python
