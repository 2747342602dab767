// CUDA attention scores over paged keys; paged_scores_cpu.h defines the result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_dtype.h"
#include "kernels/paged_scores_cpu.h"

namespace beaconkv::kernels {

// Same arguments as PagedAttentionScoresCpu, all arrays on the device, plus the keys' storage
// type (16-bit keys are read into floats: the twin, fed the keys converted to float, defines
// the result). All heads in one launch: one thread block per head, or, with query == kMax and
// shape.max_queries given, up to 16 per head, each taking some of its chunks of 64 query rows
// (then the scores are zeroed first and the blocks' maxima combined with atomicMax). head_dim must
// be 32, 64, 128 or 256, group_size 1..64 (cudaErrorInvalidValue otherwise). Needs no scratch.
// Exponentials and summation order differ from the CPU twin (expf vs its polynomial, tiled
// reductions), so scores agree to rounding.
cudaError_t PagedAttentionScores(const void* k_cache, KvDtype dtype, const int32_t* block_tables,
                                 const int32_t* lengths, const int32_t* table_of_head,
                                 const float* queries, const int32_t* query_offsets,
                                 const int32_t* score_offsets, const uint8_t* excluded,
                                 const PagedScoresShape& shape, float* scores, cudaStream_t stream);

}  // namespace beaconkv::kernels
