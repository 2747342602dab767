#include "block_manager/memory_check.h"

#include <sys/resource.h>
#include <unistd.h>

#include <limits>

#include "absl/strings/str_format.h"

namespace beaconkv {

int64_t CpuKvStoreBytes(int64_t num_blocks, int64_t block_size, int64_t head_dim) {
  // Per slot: a key and a value of head_dim floats, and an int32 position.
  int64_t per_slot = 0, slots = 0, bytes = 0;
  if (__builtin_mul_overflow(head_dim, int64_t{2 * sizeof(float)}, &per_slot) ||
      __builtin_add_overflow(per_slot, int64_t{sizeof(int32_t)}, &per_slot) ||
      __builtin_mul_overflow(num_blocks, block_size, &slots) ||
      __builtin_mul_overflow(slots, per_slot, &bytes)) {
    return -1;
  }
  return bytes;
}

absl::Status CheckHostMemory(int64_t bytes, const std::string& what) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (bytes < 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: its size in bytes overflows a 64-bit integer", what));
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  int64_t limit = std::numeric_limits<int64_t>::max();
  const char* limit_name = "";
  if (pages > 0 && page_size > 0) {
    limit = static_cast<int64_t>(pages) * page_size;
    limit_name = "this machine's memory";
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      static_cast<uint64_t>(rl.rlim_cur) < static_cast<uint64_t>(limit)) {
    limit = static_cast<int64_t>(rl.rlim_cur);
    limit_name = "the process's address-space limit (ulimit -v)";
  }
  if (bytes > limit) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s needs %.2f GiB, more than %s (%.2f GiB)", what, bytes / kGiB,
                        limit_name, limit / kGiB));
  }
  return absl::OkStatus();
}

}  // namespace beaconkv
