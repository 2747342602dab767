// The scoring pipeline every attention-based policy shares: logits of a set of queries
// against a head's keys (one BLAS GEMM), softmax over a chosen key range, reduction over the
// query heads of the GQA group and over the observation queries, then 1-D pooling over
// neighbouring tokens. Keys are taken in position order (OrderedHead), so "neighbouring" and
// "recent" mean neighbours and recency in the original token sequence.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/policy_types.h"

namespace beaconkv {

// How the query heads of one GQA group are combined, per observation query.
enum class GqaReduction {
  kMaxLogits,  // max over the group of the logits, then one softmax (R-KV, decode SnapKV)
  kMaxProbs,   // softmax per query head, then max (BeaconKV)
  kMeanProbs,  // softmax per query head, then mean (TOVA, RPC, kvpress SnapKV)
};

// How observation queries are combined after the GQA reduction.
enum class QueryReduction { kMax, kMean, kSum };

// 1-D pooling over neighbouring tokens (PyTorch semantics, stride 1, padding kernel/2):
// kMax pads with -inf; kAvg pads with zeros that count in the divisor (count_include_pad).
enum class Pooling { kNone, kMax, kAvg };

const char* GqaReductionName(GqaReduction r);
const char* QueryReductionName(QueryReduction r);
const char* PoolingName(Pooling p);

// A head's keys reordered by position (oldest first). Gathers only when slot order differs
// from position order. A HeadKeys without keys (keys == nullptr) gives the order and the
// positions only; keys() is then null.
class OrderedHead {
 public:
  OrderedHead(const HeadKeys& head, int32_t head_dim);

  int32_t size() const { return num_tokens_; }
  int32_t head_dim() const { return head_dim_; }
  const float* keys() const { return keys_; }              // [size, head_dim]
  const int32_t* positions() const { return positions_; }  // [size], ascending
  int32_t slot(int32_t i) const { return order_.empty() ? i : order_[i]; }

 private:
  int32_t num_tokens_;
  int32_t head_dim_;
  const float* keys_;                // [num_tokens, head_dim] position order
  const int32_t* positions_;         // [num_tokens] ascending
  std::vector<int32_t> order_;       // [num_tokens] slot of the i-th oldest; empty = identity
  std::vector<float> gathered_;      // [num_tokens, head_dim] when order_ is not identity
  std::vector<int32_t> sorted_pos_;  // [num_tokens] when order_ is not identity
};

struct ScoreSpec {
  GqaReduction gqa = GqaReduction::kMaxProbs;
  QueryReduction query = QueryReduction::kMax;
  // True: queries and keys are rounded to bfloat16 (RoundToBf16) before the products, which
  // are then exact in float32 and summed in float32; the softmax and the reductions as
  // without. On a CPU with AVX-512 BF16 the products take half the instructions.
  bool bf16 = false;
  bool operator==(const ScoreSpec&) const = default;
};

// x rounded to the nearest bfloat16 (ties to even), as a float: NaN stays NaN (quiet),
// infinities stay, a denormal input becomes a zero of its sign (as the AVX-512 BF16
// conversion does), and a value past bfloat16's largest finite rounds to infinity.
float RoundToBf16(float x);
// out[i] = the 16 bits of RoundToBf16(x[i]) (the upper half of its float), for i < n; with
// AVX-512 BF16 16 at a time (core/bf16.cc).
void RoundToBf16Bits(const float* x, int32_t n, uint16_t* out);
// The same bits, written with non-temporal stores where `out` is 32-byte aligned (a row that
// is read back much later: no read of the line before the write); ordinary stores elsewhere.
// A reader on another thread needs the writer's StreamFence between (a lock is not enough).
void StreamBf16Bits(const float* x, int32_t n, uint16_t* out);
// std::copy_n(x, n, out), with non-temporal stores where `out` is 64-byte aligned.
void StreamRow(const float* x, int32_t n, float* out);
// Orders the non-temporal stores of this thread before its later stores (sfence).
void StreamFence();
// A bfloat16's bits back to the float they stand for.
inline float FromBf16Bits(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}
// out[i] = FromBf16Bits(bits[i]) for i < n (vectorised for this CPU).
void FromBf16Row(const uint16_t* bits, int64_t n, float* out);

namespace internal {
// For tests: whether this CPU has AVX-512 BF16, and its conversion (vcvtneps2bf16) of n floats
// (n a multiple of 16), widened back to float: what the fused scorer's bf16 path computes with.
bool HasBf16Conversion();
void ConvertToBf16WithTheCpu(const float* x, int32_t n, float* out);
}  // namespace internal

// Reusable buffers so a compression event allocates once.
struct ScoreScratch {
  std::vector<float> logits;  // [num_queries * group_size, num_keys]
  std::vector<float> row;     // [num_keys]
  std::vector<float> keys_t;  // keys transposed, [head_dim, num_keys rounded up to 16]
  // ScoreSpec::bf16: the rounded keys and queries where the scorer needs them as floats, and
  // the bfloat16 pairs (two per 32-bit word) the AVX-512 BF16 products read.
  std::vector<float> rounded_keys;
  std::vector<float> rounded_queries;
  std::vector<int32_t> key_pairs;    // [num_keys rounded up to 16, head_dim / 2]
  std::vector<int32_t> key_pairs_t;  // transposed, [head_dim / 2, num_keys rounded up to 16]
  std::vector<int32_t> query_pairs;  // [rows, head_dim / 2]
};

// out[j - begin] = reduce_queries(reduce_gqa(softmax over keys [begin, end) of q·k/sqrt(d)))
// for keys j in [begin, end) of `keys` (position order). queries: [num_queries, group_size,
// head_dim]. out: [end - begin]. An empty key range or zero queries leaves `out` all zero.
void AttentionScores(const float* keys, int32_t begin, int32_t end, int32_t head_dim,
                     const float* queries, int32_t num_queries, int32_t group_size,
                     const ScoreSpec& spec, float* out, ScoreScratch* scratch);

// In-place pooling of `scores` (position order). kernel must be odd and >= 1.
void Pool1d(Pooling pooling, int32_t kernel, absl::Span<float> scores);

// Numerically stable softmax of x in place; returns nothing, handles n == 0.
void SoftmaxInPlace(float* x, int32_t n);

absl::Status ValidatePoolKernel(int32_t kernel, const char* policy);

}  // namespace beaconkv
