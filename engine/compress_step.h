// The keep-sets of one step's compressions, for sequences that share a block manager and a
// host store: what the reference engine and the vLLM backend (bindings/vllm_bindings.cc)
// both run after a decode step, so that they decide alike.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "block_manager/block_manager.h"
#include "block_manager/kv_store.h"
#include "core/policy.h"
#include "kernels/scorer.h"

namespace beaconkv {

// Copies one head's keys (slot order; skipped when keys == nullptr) and positions out of the
// store; the returned HeadKeys points into them. The sequence must exist.
HeadKeys GatherHead(const BlockManager& bm, const CpuKvStore& store, SequenceId id, int32_t layer,
                    int32_t kv_head, std::vector<float>* keys, std::vector<int32_t>* positions);

// The policy's keep-sets for every layer of `id` whose heads are due (DueHeads on the retained
// counts), from Compress on the gathered keys; layers ascending. Reads only. With num_threads
// > 1 and a policy whose layers compress concurrently (LayersConcurrent), the due layers (the
// due heads, HeadsConcurrent) run on that many OpenMP threads: the same keep-sets.
absl::StatusOr<std::vector<KeepSet>> HostKeepSets(const BlockManager& bm, const CpuKvStore& store,
                                                  PolicyState& policy, SequenceId id,
                                                  int32_t current_position, int num_threads = 1);

struct CompressTarget {
  SequenceId id = 0;
  PolicyState* policy = nullptr;
  int32_t current_position = 0;  // the newest cached token's position
};

// HostKeepSets for several sequences (distinct ids) at once: per target, the keep-sets it
// gives the target alone, or the target's error. With num_threads > 1 every target's work runs
// in one OpenMP region: a target per task, or, when its policy's layers (heads) compress
// concurrently, a due layer (head) per task; every task runs. With one thread the targets
// are compressed in turn, each stopping at its first failing layer.
std::vector<absl::StatusOr<std::vector<KeepSet>>> HostKeepSets(
    const BlockManager& bm, const CpuKvStore& store, absl::Span<const CompressTarget> targets,
    int num_threads);

// HostKeepSets for every target, except that layers whose policy plans (PlanScoring) are
// scored and selected by `scorer`, all of a step's planned heads in one call per scoring
// shape (the device's batch). Per target, layers ascending. Reads only; policies advance as
// Compress would.
absl::StatusOr<std::vector<std::vector<KeepSet>>> ScoredKeepSets(
    const BlockManager& bm, const CpuKvStore& store, Scorer& scorer,
    absl::Span<const CompressTarget> targets);

// Distinct layers among keep-sets ordered by layer (one compression event each).
int64_t CountLayers(absl::Span<const KeepSet> sets);

}  // namespace beaconkv
