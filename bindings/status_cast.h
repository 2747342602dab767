// absl::Status -> Python exception, keeping the C++ message.
#pragma once

#include <pybind11/pybind11.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace beaconkv::py_util {

// kResourceExhausted -> MemoryError; argument and state errors -> ValueError;
// anything else -> RuntimeError.
[[noreturn]] inline void ThrowStatus(const absl::Status& s) {
  const std::string msg(s.message());
  switch (s.code()) {
    case absl::StatusCode::kResourceExhausted:
      PyErr_SetString(PyExc_MemoryError, msg.c_str());
      throw pybind11::error_already_set();
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

}  // namespace beaconkv::py_util
