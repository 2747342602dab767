// Early return on a non-OK absl::Status / absl::StatusOr, so that no call site writes the
// check by hand and no StatusOr is dereferenced before it is known to hold a value.
//
//   BKV_RETURN_IF_ERROR(pool.Validate());
//   BKV_ASSIGN_OR_RETURN(std::unique_ptr<PolicyState> state, NewPolicyState(c, g, n));
//   const int32_t n = BKV_CHECK_VALUE(bm.RetainedTokens(id, layer, head));  // cannot fail here
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/check.h"

#define BKV_STATUS_CONCAT_INNER_(a, b) a##b
#define BKV_STATUS_CONCAT_(a, b) BKV_STATUS_CONCAT_INNER_(a, b)

#define BKV_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                              \
    if (::absl::Status bkv_status_ = (expr); !bkv_status_.ok()) return bkv_status_; \
  } while (0)

// `lhs` may declare a variable (`auto x`, `T x`) or name an existing one.
#define BKV_ASSIGN_OR_RETURN(lhs, rexpr) \
  BKV_ASSIGN_OR_RETURN_IMPL_(BKV_STATUS_CONCAT_(bkv_status_or_, __LINE__), lhs, rexpr)

#define BKV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = *std::move(tmp)

namespace beaconkv::internal {
template <typename T>
T ValueOrDie(absl::StatusOr<T> v, const char* file, int line, const char* expr) {
  if (!v.ok()) CheckFailed(file, line, expr, std::string(v.status().message()).c_str());
  return *std::move(v);
}
}  // namespace beaconkv::internal

// The value of a StatusOr that holds one unless an invariant is broken (a CHECK failure
// with the status' message otherwise), e.g. a lookup of a sequence the caller just found.
#define BKV_CHECK_VALUE(expr) ::beaconkv::internal::ValueOrDie((expr), __FILE__, __LINE__, #expr)
