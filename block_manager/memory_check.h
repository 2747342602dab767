// Whether this process can allocate a host buffer: sizes computed in 64 bits and compared with
// the machine's memory and the process's address-space limit (ulimit -v), so that a pool too
// large for the machine is a clear kResourceExhausted instead of std::bad_alloc or the OOM
// killer.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace beaconkv {

// Bytes a CpuKvStore of this geometry allocates (keys, values and positions); -1 on overflow.
int64_t CpuKvStoreBytes(int64_t num_blocks, int64_t block_size, int64_t head_dim);

// OK when `bytes` fits under both the physical memory and RLIMIT_AS; else kResourceExhausted
// naming `what` (e.g. "KV pool of 5000 blocks") and both sizes.
absl::Status CheckHostMemory(int64_t bytes, const std::string& what);

}  // namespace beaconkv
