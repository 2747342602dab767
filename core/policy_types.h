// Plain views and results shared by every eviction policy. A policy sees one
// (layer, kv_head) at a time through these; nothing here owns device memory.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rope.h"

namespace beaconkv {

// The model geometry a per-sequence policy state is built for.
struct PolicyGeometry {
  int32_t num_layers = 1;
  int32_t num_kv_heads = 1;
  int32_t group_size = 1;  // query heads per kv head (GQA ratio)
  RopeConfig rope;         // rope.head_dim is the head dimension

  int32_t head_dim() const { return rope.head_dim; }
  int32_t num_heads_total() const { return num_layers * num_kv_heads; }
  int32_t HeadIndex(int32_t layer, int32_t kv_head) const { return layer * num_kv_heads + kv_head; }
};

// The cached keys of one (layer, kv_head) in slot order, as the block manager holds them.
// Slot order is NOT position order once a head has been compacted.
struct HeadKeys {
  const float* keys = nullptr;         // [num_tokens, head_dim], post-RoPE
  const int32_t* positions = nullptr;  // [num_tokens], original token positions, unique
  int32_t num_tokens = 0;
};

// One step's queries of the query heads of one kv group.
struct StepQueries {
  int32_t position = 0;              // position of the token that produced these queries
  const float* pre_rope = nullptr;   // [group_size, head_dim]
  const float* post_rope = nullptr;  // [group_size, head_dim]
};

// The slots one (layer, kv_head) keeps: indexes in [0, that head's token count), ascending.
// What a policy's Compress returns and what BlockManager::ApplyKeepSets takes.
struct KeepSet {
  int32_t layer = 0;
  int32_t kv_head = 0;
  std::vector<int32_t> slots;  // [kept], ascending
};

}  // namespace beaconkv
