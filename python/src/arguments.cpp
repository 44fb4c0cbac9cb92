// The arguments of the Python API, checked one by one before any work: a wrong type or value is
// a ValueError of one line naming the function, the argument and the value, e.g.
// "[python] evolve: steps must be an integer in [1, 1000000000], got 1180591620717411303424",
// never pybind11's TypeError with its signature dump (which names neither).
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>
#include <string_view>

#include "python.hpp"

namespace ffnlab::python {

[[noreturn]] void bad_argument(std::string_view function, std::string_view name,
                               std::string_view expected, const py::handle& value) {
  throw py::value_error(
      fmt::format("[python] {}: {} must be {}, got {}", function, name, expected, shown(value)));
}

bool bool_argument(std::string_view function, std::string_view name, const py::handle& v) {
  if (PyBool_Check(v.ptr()) || numpy_scalar(v, "bool_")) {
    const int truth = PyObject_IsTrue(v.ptr());
    if (truth < 0) throw py::error_already_set();
    return truth == 1;
  }
  bad_argument(function, name, "True or False", v);
}

// An integer in [lo, hi]: a Python int or another integer type (numpy's), never a bool.
std::int64_t int_argument(std::string_view function, std::string_view name, const py::handle& v,
                          std::int64_t lo, std::int64_t hi, bool none_is_default) {
  const std::string expected = fmt::format("an integer in [{}, {}]{}", lo, hi,
                                           none_is_default ? " (None: the default)" : "");
  if (!(PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) && !numpy_scalar(v, "integer"))
    bad_argument(function, name, expected, v);
  const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0 || x < lo || x > hi) bad_argument(function, name, expected, v);
  return static_cast<std::int64_t>(x);
}

// A random seed: an integer in [0, 2^64 − 1], as `--seed` takes (numpy's too), never a bool.
std::uint64_t seed_argument(std::string_view function, const py::handle& v) {
  constexpr std::string_view expected = "an integer in [0, 2^64 - 1]";
  if (!(PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) && !numpy_scalar(v, "integer"))
    bad_argument(function, "seed", expected, v);
  const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  const unsigned long long x = PyLong_AsUnsignedLongLong(i.ptr());
  if (x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();  // negative or beyond 64 bits
    bad_argument(function, "seed", expected, v);
  }
  return static_cast<std::uint64_t>(x);
}

namespace {

// v as a finite double: an int or a float (numpy's too), never a bool; else a ValueError that
// says it must be `expected`.
double finite_number(std::string_view function, std::string_view name, const py::handle& v,
                     std::string_view expected) {
  PyObject* o = v.ptr();
  const bool real = (PyLong_Check(o) && !PyBool_Check(o)) || PyFloat_Check(o) ||
                    numpy_scalar(v, "integer") || numpy_scalar(v, "floating");
  if (!real) bad_argument(function, name, expected, v);
  const double x = PyFloat_AsDouble(o);
  if (x == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();  // an int beyond a double's range
    bad_argument(function, name, expected, v);
  }
  if (!std::isfinite(x)) bad_argument(function, name, expected, v);
  return x;
}

}  // namespace

// A finite real number in (lo, hi]: an int or a float (numpy's too), never a bool.
double real_argument(std::string_view function, std::string_view name, const py::handle& v,
                     double lo, double hi) {
  // The flag's rule too (real_in): a value that single precision would make 0 is refused.
  return real_from_argument(function, name, v, lo, hi, false, "None: the default", true);
}

// A finite real number in [lo, hi], or [lo, hi) when `below_hi`: an int or a float (numpy's
// too), never a bool. `note` ends the message: what None gives, or what a value means.
double real_from_argument(std::string_view function, std::string_view name, const py::handle& v,
                          double lo, double hi, bool below_hi, std::string_view note,
                          bool above_lo) {
  const std::string expected = fmt::format("a number in {}{}, {}{} ({})", above_lo ? "(" : "[", lo,
                                           hi, below_hi ? ")" : "]", note);
  const double x = finite_number(function, name, v, expected);
  // As `real_in` checks a flag: the bounds hold in single precision too, where the settings
  // live (dropout 0.99999999 would become 1.0f), and no value but 0 becomes 0 there.
  const double f = std::abs(x) <= std::numeric_limits<float>::max()
                       ? static_cast<double>(static_cast<float>(x))
                       : x;
  const auto within = [&](double y) {
    return (above_lo ? y > lo : y >= lo) && (below_hi ? y < hi : y <= hi);
  };
  if (!within(x) || !within(f) || (x != 0 && f == 0)) bad_argument(function, name, expected, v);
  return x;
}

double finite_argument(std::string_view function, std::string_view name, const py::handle& v) {
  return finite_number(function, name, v, "a finite number");
}

// A path: a str or an os.PathLike (bytes too, decoded as the file system does), not empty and
// without NUL characters (which the system calls would cut the name at).
std::string path_argument(std::string_view function, std::string_view name, const py::handle& v) {
  constexpr std::string_view expected = "a path (a str or os.PathLike), not empty";
  const bool pathlike =
      PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) || py::hasattr(v, "__fspath__");
  if (!pathlike) bad_argument(function, name, expected, v);
  std::string path;
  try {
    path = py::str(py::module_::import("os").attr("fsdecode")(v)).cast<std::string>();
  } catch (const py::error_already_set&) {  // __fspath__ failed or gave another type
    bad_argument(function, name, expected, v);
  } catch (const py::cast_error&) {  // a name UTF-8 cannot hold
    bad_argument(function, name, expected, v);
  }
  if (path.empty()) bad_argument(function, name, expected, v);
  if (path.find('\0') != std::string::npos)
    bad_argument(function, name, "a path without NUL characters", v);
  return path;
}

// A str (never bytes or another type).
std::string string_argument(std::string_view function, std::string_view name, const py::handle& v) {
  if (!PyUnicode_Check(v.ptr())) bad_argument(function, name, "a string", v);
  return py::str(v).cast<std::string>();
}

}  // namespace ffnlab::python
