// Pieces shared by the policy implementations; not part of the public interface.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "core/capped_growth.h"
#include "core/policy.h"
#include "core/scoring.h"

namespace beaconkv::internal {

// The newest `capacity` steps of one head's queries, each `row_floats` floats. Memory grows
// with the steps pushed, up to the capacity: a large window (a knob has no upper bound)
// costs what a sequence fills of it, not its size up front. bf16: the rows are kept as
// bfloat16 (rounded on arrival with RoundToBf16, half the bytes) and read back widened.
class QueryRing {
 public:
  // stream: rows are written with non-temporal stores (StreamRow, StreamBf16Bits); the owner
  // fences them (StreamFence) before another thread reads the ring.
  QueryRing(int32_t capacity, int32_t row_floats, bool bf16 = false, bool stream = false)
      : capacity_(std::max(capacity, 0)),
        row_floats_(std::max(row_floats, 0)),
        bf16_(bf16),
        stream_(stream) {}

  void Push(const float* row);
  int32_t size() const { return size_; }
  // Copies the held steps, oldest first, into out: [size, row_floats].
  void CopyOrdered(float* out) const;
  // The same into a vector sized to fit (a plan's query rows); returns size().
  int32_t CopyOrdered(std::vector<float>* out) const {
    out->resize(static_cast<size_t>(size_) * row_floats_);
    CopyOrdered(out->data());
    return size_;
  }
  // Bytes the storage holds now (it grows with the steps pushed).
  int64_t HeldBytes() const {
    return static_cast<int64_t>(data_.capacity() * sizeof(float) +
                                data16_.capacity() * sizeof(uint16_t));
  }
  // At capacity (PolicyState::StateBytes counts buffers full).
  int64_t Bytes() const {
    return int64_t{capacity_} * row_floats_ *
           static_cast<int64_t>(bf16_ ? sizeof(uint16_t) : sizeof(float));
  }

 private:
  int32_t capacity_;
  int32_t row_floats_;
  int32_t size_ = 0;
  int32_t next_ = 0;  // ring slot the next Push writes
  bool bf16_;
  bool stream_;
  std::vector<float, CacheAlignedRows<float>> data_;  // [min(pushed, capacity), row_floats]
  std::vector<uint16_t, CacheAlignedRows<uint16_t>>
      data16_;  // the same as bfloat16 bits, instead, with bf16
};

// One head's scored selection problem, in position order.
struct ScoredHead {
  int32_t kv_head = 0;
  std::unique_ptr<OrderedHead> ordered;
  std::vector<uint8_t> protect;  // [n]
  std::vector<float> scores;     // [n]
};

// Heads holding at least `threshold` tokens.
std::vector<int32_t> DueUniform(absl::Span<const int32_t> head_tokens, int64_t threshold);
// Every head when the layer holds at least threshold * num_kv_heads tokens, else none.
std::vector<int32_t> DuePooled(absl::Span<const int32_t> head_tokens, int64_t threshold);
// The budget + interval trigger of the scored policies: DueUniform or DuePooled.
std::vector<int32_t> DueOverBudget(BudgetMode mode, absl::Span<const int32_t> head_tokens,
                                   int32_t budget, int32_t interval);

// Position-order indexes of one head -> its keep-set (slots ascending).
KeepSet ToKeepSet(int32_t layer, int32_t kv_head, const OrderedHead& ordered,
                  absl::Span<const int32_t> indexes);

// Uniform: each head keeps `budget`; pooled: the heads share budget * heads.size().
std::vector<KeepSet> SelectScoredHeads(int32_t layer, std::vector<ScoredHead>& heads,
                                       BudgetMode mode, int64_t budget);

// Number of tokens with position < prompt_len (positions ascending).
int32_t CountPrompt(const OrderedHead& ordered, int32_t prompt_len);

std::unique_ptr<PolicyState> NewFullState(const PolicyGeometry& g, int32_t prompt_len);
std::unique_ptr<PolicyState> NewStreamingState(const StreamingConfig& c, const PolicyGeometry& g,
                                               int32_t prompt_len);
std::unique_ptr<PolicyState> NewH2OState(const H2OConfig& c, const PolicyGeometry& g,
                                         int32_t prompt_len);
std::unique_ptr<PolicyState> NewTovaState(const TovaConfig& c, const PolicyGeometry& g,
                                          int32_t prompt_len);
std::unique_ptr<PolicyState> NewSnapKvState(const SnapKvConfig& c, const PolicyGeometry& g,
                                            int32_t prompt_len);
std::unique_ptr<PolicyState> NewRkvState(const RkvConfig& c, const PolicyGeometry& g,
                                         int32_t prompt_len);
std::unique_ptr<PolicyState> NewRpcState(const RpcConfig& c, const PolicyGeometry& g,
                                         int32_t prompt_len);
std::unique_ptr<PolicyState> NewBeaconState(const BeaconConfig& c, const PolicyGeometry& g,
                                            int32_t prompt_len);

}  // namespace beaconkv::internal
