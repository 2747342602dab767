// The one way the bindings check a NumPy argument: dtype (converted when it can be), C order,
// and shape, with one wording for every error:
//   "keys must be a float32 array of shape [4, 2, *, 16], got shape [4, 2, 7]"
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace beaconkv::py_util {

template <typename T>
using Array = pybind11::array_t<T, pybind11::array::c_style | pybind11::array::forcecast>;
using FloatArray = Array<float>;
using IntArray = Array<int32_t>;

// One dimension of an expected shape: an exact size, any size (kAnySize), or at least `size`.
struct Dim {
  Dim(pybind11::ssize_t n) : size(n) {}  // NOLINT: sizes read as plain numbers at call sites
  pybind11::ssize_t size;
  bool at_least = false;
};
inline constexpr pybind11::ssize_t kAnySize = -1;
inline Dim AtLeast(pybind11::ssize_t n) {
  Dim d(n);
  d.at_least = true;
  return d;
}

namespace internal {
template <typename T>
const char* DtypeName() {  // with its article
  if constexpr (std::is_same_v<T, float>) return "a float32";
  if constexpr (std::is_same_v<T, int32_t>) return "an int32";
  return "a numeric";
}

inline std::string ShapeText(const std::vector<Dim>& shape) {
  std::vector<std::string> parts;
  for (const Dim& d : shape) {
    parts.push_back(d.size == kAnySize ? "*" : absl::StrCat(d.at_least ? ">=" : "", d.size));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

[[noreturn]] inline void Fail(const char* name, const char* dtype, const std::vector<Dim>& shape,
                              const std::string& got) {
  throw pybind11::value_error(
      absl::StrCat(name, " must be ", dtype, " array of shape ", ShapeText(shape), ", got ", got));
}
}  // namespace internal

// Raises ValueError (the wording above) unless `a` has `shape`.
template <typename T>
void CheckShape(const pybind11::array& a, const char* name, const std::vector<Dim>& shape) {
  bool ok = a.ndim() == static_cast<pybind11::ssize_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    const Dim& d = shape[i];
    ok = d.size == kAnySize || (d.at_least ? a.shape(i) >= d.size : a.shape(i) == d.size);
  }
  if (ok) return;
  std::vector<std::string> got;
  for (pybind11::ssize_t i = 0; i < a.ndim(); ++i) got.push_back(absl::StrCat(a.shape(i)));
  internal::Fail(name, internal::DtypeName<T>(), shape,
                 absl::StrCat("shape [", absl::StrJoin(got, ", "), "]"));
}

// `obj` as a C-ordered T array of `shape` (converted from other dtypes and layouts); ValueError
// otherwise.
template <typename T>
Array<T> CheckedArray(pybind11::handle obj, const char* name, const std::vector<Dim>& shape) {
  Array<T> a = Array<T>::ensure(obj);
  if (!a) {
    PyErr_Clear();
    internal::Fail(
        name, internal::DtypeName<T>(), shape,
        absl::StrCat("a ",
                     pybind11::str(pybind11::type::of(obj).attr("__name__")).cast<std::string>()));
  }
  CheckShape<T>(a, name, shape);
  return a;
}

}  // namespace beaconkv::py_util
