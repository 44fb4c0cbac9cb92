// numpy arrays <-> ffnlab tensors, without copies: an input array is checked (float32,
// C-contiguous, the expected shape) and borrowed; an output array is allocated by numpy and the
// layer writes into it. Any other array is refused with a ValueError that says why, before a
// byte of it is read.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "ffnlab/tensor.hpp"

namespace ffnlab::python {

namespace py = pybind11;

// `a` as a borrowed [rows, cols] f32 tensor; cols must equal `cols`. `what` names the argument.
Tensor borrow_rows(const py::array& a, std::int64_t cols, const char* what);

// A new float32 numpy array [rows, cols] and the tensor that writes into it.
std::pair<py::array_t<float>, Tensor> new_rows(std::int64_t rows, std::int64_t cols);

// A numpy view of `t` (f32) whose memory stays alive as long as `owner` does.
py::array_t<float> view_of(const Tensor& t, const py::object& owner);

}  // namespace ffnlab::python
