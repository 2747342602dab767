// R-KV's redundancy term over paged keys: the CPU function that defines the result of the
// CUDA kernel in redundancy.cu. One "head" is one (sequence, layer, kv_head); its keys are
// the first lengths[t] slots of block table t = table_of_head[h], in slot order, with their
// positions.
//
// out of head h = core RedundancyScores over the head's keys taken in position order (each
// key's cosine similarity to every other, the newest near-duplicate of each row left out,
// column means, softmax), written back in slot order.
#pragma once

#include <cstdint>

namespace beaconkv::kernels {

struct RedundancyShape {
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int32_t max_blocks = 0;  // row stride of block_tables
  float threshold = 0.5f;  // cosine above which two keys are near-duplicates
};

void PagedRedundancyScoresCpu(const float* k_cache,          // [num_blocks, block_size, head_dim]
                              const int32_t* block_tables,   // [num_tables, max_blocks]
                              const int32_t* lengths,        // [num_tables]
                              const int32_t* table_of_head,  // [num_heads]
                              const int32_t* positions,  // [score_offsets[num_heads]] slot order
                              const int32_t* score_offsets,  // [num_heads + 1]; sizes = lengths
                              const RedundancyShape& shape,
                              float* out);  // [score_offsets[num_heads]], slot order

}  // namespace beaconkv::kernels
