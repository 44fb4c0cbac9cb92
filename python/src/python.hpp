// What the extension's source files share: JSON to and from Python objects, and the bindings
// each file adds to the module.
#pragma once

#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>

namespace ffnlab::python {

namespace py = pybind11;

// A Python object (dict, list, number, ...) as JSON, through Python's own json module;
// ValueError for what JSON cannot hold (NaN, infinities, other types).
nlohmann::json to_json(const py::handle& obj);
// JSON as Python objects (dicts, lists, numbers, strings).
py::object from_json(const nlohmann::json& j);
py::object from_json(const nlohmann::ordered_json& j);

// study.cpp: TransformerLM, train, _evolve.
void add_study(py::module_& m);

}  // namespace ffnlab::python
