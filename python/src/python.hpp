// What the extension's source files share: JSON to and from Python objects, and the bindings
// each file adds to the module.
#pragma once

#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>
#include <string>

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
// JSON as Python objects (dicts, lists, numbers, strings).
py::object from_json(const nlohmann::json& j);
py::object from_json(const nlohmann::ordered_json& j);

// study.cpp: TransformerLM, train, _evolve.
void add_study(py::module_& m);

}  // namespace ffnlab::python
