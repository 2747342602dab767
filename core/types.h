// Ids and shapes shared by every layer of BeaconKV.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace beaconkv {

using BlockId = int32_t;     // index into the physical block pool; 0 is the null block
using SequenceId = int64_t;  // caller-chosen, unique among live sequences

inline constexpr BlockId kNullBlock = 0;

// The geometry of one KV cache: every physical block holds `block_size` slots of ONE
// (sequence, layer, kv_head).
struct KvShape {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;

  int32_t num_heads_total() const { return num_layers * num_kv_heads; }
  // Flat index of (layer, kv_head) in every per-head array: layer-major.
  int32_t HeadIndex(int32_t layer, int32_t kv_head) const { return layer * num_kv_heads + kv_head; }
  int32_t BlocksFor(int64_t tokens) const {
    return static_cast<int32_t>((tokens + block_size - 1) / block_size);
  }
  absl::Status Validate() const;
};

// Where one token lives: a slot inside a physical block.
struct SlotRef {
  BlockId block = kNullBlock;
  int32_t offset = 0;  // in [0, block_size)
  bool operator==(const SlotRef&) const = default;
};

}  // namespace beaconkv
