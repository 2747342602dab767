// absl::Status -> Python exception, keeping the C++ message; and the one way bindings run C++
// work without the GIL.
//
// GIL rule: a status is converted only with the GIL held. ThrowStatus itself never touches the
// Python C API (it throws C++ exceptions that pybind11 translates after the call returns, with
// the GIL re-acquired), so it is safe either way; WithoutGil makes the usual pattern — release,
// compute a Status, re-acquire, convert — the only one the bindings use.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace beaconkv::py_util {

// A MemoryError raised through pybind11's translator: set_error runs with the GIL held.
class MemoryErrorException : public pybind11::builtin_exception {
 public:
  using builtin_exception::builtin_exception;
  void set_error() const override { PyErr_SetString(PyExc_MemoryError, what()); }
};

// kResourceExhausted -> MemoryError; argument and state errors -> ValueError;
// anything else -> RuntimeError.
[[noreturn]] inline void ThrowStatus(const absl::Status& s) {
  const std::string msg(s.message());
  switch (s.code()) {
    case absl::StatusCode::kResourceExhausted:
      throw MemoryErrorException(msg);
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      throw pybind11::value_error(msg);
    default:
      throw std::runtime_error(msg);
  }
}

inline void Check(const absl::Status& s) {
  if (!s.ok()) ThrowStatus(s);
}

template <typename T>
T Unwrap(absl::StatusOr<T> v) {
  if (!v.ok()) ThrowStatus(v.status());
  return *std::move(v);
}

// Runs `f` (plain C++: no Python objects) with the GIL released and returns its result once
// the GIL is held again, so the caller converts statuses safely. Should `f` throw (Unwrap,
// Check), the GIL is re-taken as the exception leaves and pybind11 translates it then.
template <typename F>
auto WithoutGil(F&& f) -> decltype(f()) {
  pybind11::gil_scoped_release release;
  return f();
}

}  // namespace beaconkv::py_util
