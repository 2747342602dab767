// CUDA paged decode attention reworked for bandwidth; paged_attention_cpu.h defines the
// result (PagedDecodeAttentionCpu, fed the cache converted to float).
//
// Against PagedDecodeAttention: one thread block per (row, kv_head, split) serves the whole
// GQA group from one read of each K/V slot; the cache may be stored as fp32, bf16 or fp16
// (fp32 math); each lane loads 16 bytes at a time and a warp keeps several tokens in flight;
// long heads are split across blocks and the splits merged by a second kernel
// (flash-decoding style).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kv_dtype.h"
#include "kernels/paged_attention_cpu.h"

namespace beaconkv::kernels {

// The number of splits (1 .. one per 256 tokens of max_len) whose rows x kv_heads x splits
// thread blocks keep the largest share of the GPU's num_sms x blocks_per_sm resident slots
// busy over their waves; the fewest splits within 5 % of the best. blocks_per_sm: what
// GqaBlocksPerSm says for the kernel that will run (2 if unknown).
int32_t ChooseNumSplits(const PagedAttentionShape& shape, int32_t num_sms,
                        int32_t blocks_per_sm = 2);

// How many thread blocks of the kernel serving (shape, dtype) one SM of the current device
// holds at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
cudaError_t GqaBlocksPerSm(const PagedAttentionShape& shape, KvDtype dtype, int32_t* blocks_per_sm);

// Same arguments and result as PagedDecodeAttention, plus: `dtype` of k_cache / v_cache
// (q and out stay fp32), `num_splits` >= 1, and two-phase workspace (CUB style: with
// workspace == nullptr only *workspace_bytes is written, >= 16; num_splits == 1 needs none).
// head_dim must be 32, 64 or 128 and num_heads / num_kv_heads 1, 2, 4 or 8
// (cudaErrorInvalidValue otherwise). Cache rows must be 16-byte aligned (cudaMalloc'd
// caches are).
cudaError_t PagedDecodeAttentionGqa(void* workspace,          // device scratch or nullptr
                                    size_t* workspace_bytes,  // in: size; out: size needed
                                    const float* q,           // [rows, num_heads, head_dim]
                                    const void* k_cache,      // [num_blocks, block_size, head_dim]
                                    const void* v_cache,      // [num_blocks, block_size, head_dim]
                                    KvDtype dtype,
                                    const int32_t* block_tables,  // [rows, kv_heads, max_blocks]
                                    const int32_t* lengths,       // [rows, num_kv_heads]
                                    const PagedAttentionShape& shape, float scale,
                                    int32_t num_splits,
                                    float* out,  // [rows, num_heads, head_dim]
                                    cudaStream_t stream,
                                    // as PagedDecodeAttentionCpu's, on the device, or null
                                    const float* bias = nullptr);

}  // namespace beaconkv::kernels
