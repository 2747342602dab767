// Invariant checks. A failed check is a bug in BeaconKV, never a user error: user errors
// are returned as absl::Status. Checks stay on in release builds; they guard refcounts and
// free lists, where silent corruption would cost far more than the branch.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace beaconkv::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* expr,
                                     const char* msg) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s %s\n", file, line, expr, msg);
  std::fflush(stderr);
  std::abort();
}
}  // namespace beaconkv::internal

#define BKV_CHECK(cond)                                                            \
  do {                                                                             \
    if (!(cond)) ::beaconkv::internal::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define BKV_CHECK_MSG(cond, msg)                                                    \
  do {                                                                              \
    if (!(cond)) ::beaconkv::internal::CheckFailed(__FILE__, __LINE__, #cond, msg); \
  } while (0)
