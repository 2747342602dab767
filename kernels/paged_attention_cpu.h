// Paged decode attention over per-(row, kv_head) block tables: the CPU function that defines
// the result of the CUDA kernel in paged_attention.cu, and the engine's CPU path.
//
// For row b and query head h (kv head g = h / group): out[b, h] = sum_j p_j v_j, with
// p = softmax_j(q[b, h] . k_j * scale + bias[b, g, j]) over the n = lengths[b, g] slots of the
// head (bias 0 when `bias` is null), slot j
// being offset j % block_size of block block_tables[b, g, j / block_size]. Slots are visited
// in that logical order, so the result depends neither on the batch nor on the block size.
#pragma once

#include <cstdint>
#include <functional>

namespace beaconkv::kernels {

struct PagedAttentionShape {
  int32_t rows = 0;
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;  // num_heads % num_kv_heads == 0
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int32_t max_blocks = 0;  // row stride of block_tables
};

// Whether PagedDecodeAttentionCpu splits this work over its threads (rows x kv heads as
// tasks): num_threads > 1 and enough of it (small steps run on the calling thread, where a
// region's wake-up would cost more than it saves).
bool PagedDecodeAttentionSplits(const int32_t* lengths, const PagedAttentionShape& shape,
                                int num_threads);

// head_done (optional): called with (row, kv_head) as soon as that head's output is written,
// on the thread that computed it, so that per-head work on the step's queries (a policy's
// observation) shares the attention's threads instead of opening a region of its own; calls
// for different heads run at once when the work is split over threads. When head_done is
// given, every thread of the region issues a store fence (StreamFence) before the region's
// closing barrier, so that non-temporal stores made in the calls are visible to whichever
// thread reads them after the function returns.
// Returns the number of threads the heads were spread over (1 when the work was too small).
int PagedDecodeAttentionCpu(
    const float* q,               // [rows, num_heads, head_dim]
    const float* k_cache,         // [num_blocks, block_size, head_dim]
    const float* v_cache,         // [num_blocks, block_size, head_dim]
    const int32_t* block_tables,  // [rows, num_kv_heads, max_blocks]
    const int32_t* lengths,       // [rows, num_kv_heads]
    const PagedAttentionShape& shape, float scale,
    float* out,  // [rows, num_heads, head_dim]
    int num_threads,
    // [rows, num_kv_heads, max_blocks * block_size], logical slot
    // order; added to the logits (the CUDA kernels take the same).
    const float* bias = nullptr,
    const std::function<void(int32_t row, int32_t kv_head)>* head_done = nullptr);

}  // namespace beaconkv::kernels
