// The count bias of one sequence (BeaconConfig::count_bias, docs/policies.md "The count
// bias"): in a count-bias layer (CountBiasLayers), attention adds log(N / K) to each held
// token's logit, N being the tokens with its id the sequence has had so far and K those the
// head still holds, so that a thinned head weighs every id as the whole sequence would. Shared
// by the reference engine and the vLLM pool, which keep one per sequence.
#ifndef BEACONKV_ENGINE_COUNT_BIAS_H_
#define BEACONKV_ENGINE_COUNT_BIAS_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "block_manager/block_manager.h"
#include "block_manager/kv_store.h"
#include "core/types.h"

namespace beaconkv {

class CountBias {
 public:
  // The token id at a position of the sequence (every position up to the newest).
  using TokenAt = absl::FunctionRef<int32_t(int32_t position)>;

  // The bias of each slot of head (layer, kv_head) of sequence `id`, in logical slot order, when
  // its newest token is at `position`. Brings the id counts up to `position` first. Between
  // compressions a step adds one token to every head and only that token's id changes its
  // N / K, so a head whose last call was at position - 1 and that has only grown by its newest
  // slot is updated in place; any other change (the first call, a compression, a re-prefill)
  // counts the head again. The span is valid until the next call for the same head (each
  // head's terms live apart, so one step can hold every head's span at once).
  absl::StatusOr<absl::Span<const float>> Head(const BlockManager& bm, const CpuKvStore& store,
                                               SequenceId id, int32_t layer, int32_t kv_head,
                                               int32_t position, TokenAt token_at);

  // Prefetching, for a caller that asks about many sequences at each step: the terms of a
  // step are read once a step, so each Head() call starts with a few cache misses (the id
  // counts, the head's state and its slots' positions), and in turn they add up. Calling
  // PrefetchCounts for every sequence, then PrefetchHeads for every sequence, then Head(),
  // overlaps them. Both only hint the memory system: what Head() returns is the same either
  // way. `num_heads`: the heads to be asked, those of index layer * num_kv_heads + kv_head
  // below it.
  //
  // The id count of the step's newest token and each head's state.
  void PrefetchCounts(int32_t position, int32_t num_heads, TokenAt token_at) const;
  // What the heads' states point to (after PrefetchCounts): their count of the newest token,
  // the start of their terms, and the positions of the slots the in-place update checks.
  void PrefetchHeads(const CpuKvStore& store, int32_t position, int32_t num_heads,
                     TokenAt token_at) const;

 private:
  struct HeadState {
    std::vector<int32_t> ids;                    // held slots' ids, logical order
    std::vector<float> bias;                     // their terms
    absl::flat_hash_map<int32_t, int32_t> held;  // id -> slots that hold it (K)
    int32_t first = -1, last = -1;               // positions of the first and last slot
    SlotRef first_slot{}, last_slot{};           // and where they were
    int32_t position = -1;                       // the position of the last call
  };
  absl::flat_hash_map<int32_t, int32_t> counts_;  // id -> positions [0, counted_) (N)
  int32_t counted_ = 0;
  std::vector<HeadState> heads_;  // [layer * num_kv_heads + kv_head], sized at the first call
};

}  // namespace beaconkv

#endif  // BEACONKV_ENGINE_COUNT_BIAS_H_
