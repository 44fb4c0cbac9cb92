// numpy array checks and zero-copy wrapping (arrays.hpp).
#include "arrays.hpp"

#include <fmt/format.h>

namespace ffnlab::python {

namespace {

std::string shape_of(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

}  // namespace

Tensor borrow_rows(const py::array& a, std::int64_t cols, const char* what) {
  // Equivalent, not the same object: a float32 dtype made another way (with metadata) is
  // float32; one of the other byte order is not.
  if (!a.dtype().equal(py::dtype::of<float>()))
    throw py::value_error(fmt::format("[python] {} must be a float32 array, got {}", what,
                                      std::string(py::str(a.dtype()))));
  if (a.ndim() != 2 || a.shape(1) != cols)
    throw py::value_error(
        fmt::format("[python] {} must have shape [T, {}], got {}", what, cols, shape_of(a)));
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(fmt::format(
        "[python] {} must be C-contiguous (numpy.ascontiguousarray makes a copy that is)", what));
  // The kernels read whole floats: an array at an address no float starts at (a view into a
  // byte buffer at an odd offset) is refused rather than read at a cost or wrongly.
  if (!(a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_))
    throw py::value_error(fmt::format(
        "[python] {} must be aligned to its 4-byte floats (numpy.require(x, requirements='A') "
        "makes a copy that is)",
        what));
  // The layers never write their inputs; the cast only fits Tensor's one pointer type.
  return Tensor::borrow(const_cast<void*>(a.data()), {a.shape(0), cols});
}

std::pair<py::array_t<float>, Tensor> new_rows(std::int64_t rows, std::int64_t cols) {
  py::array_t<float> out({rows, cols});
  Tensor t = Tensor::borrow(out.mutable_data(), {rows, cols});
  return {std::move(out), std::move(t)};
}

py::array_t<float> view_of(const Tensor& t, const py::object& owner) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  return py::array_t<float>(shape, t.f32(), owner);
}

}  // namespace ffnlab::python
