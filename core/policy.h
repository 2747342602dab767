// The eviction-policy interface the engine drives, per sequence:
//
//   auto state = NewPolicyState(config, geometry, prompt_len);   // once per sequence
//   each decode step, for every (layer, kv_head):
//     state->Observe(layer, kv_head, {position, pre_rope_q, post_rope_q}, keys_or_null);
//   each decode step, for every layer:
//     due = state->DueHeads(layer, tokens_per_head);
//     if (!due.empty()) keep = state->Compress(layer, keys_of_all_heads, due, position);
//     -> BlockManager::ApplyKeepSets(seq, keep)
//
// All per-sequence memory (recent-query rings, beacon buffers, H2O accumulators, RPC
// counters) lives in the PolicyState; policies are otherwise stateless. A state is not
// thread-safe (it keeps scratch buffers): use one per sequence, from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/policy_config.h"
#include "core/policy_types.h"
#include "core/scoring.h"
#include "core/types.h"

namespace beaconkv {

// One head's share of a compression event, planned by the policy for a scorer outside it
// (the device pipeline of kernels/scorer.h, or its CPU twin): score the head's keys with
// `queries`, pool, then keep every protected slot and the `k` best others (ties: the more
// recent token). Slot order throughout, as the head's block table holds the tokens.
struct ScoringTask {
  int32_t kv_head = 0;
  int32_t num_queries = 0;       // rows of queries, each [group_size, head_dim]
  std::vector<float> queries;    // [num_queries, group_size, head_dim]
  std::vector<uint8_t> protect;  // [num_tokens()] slot order, 1 = kept whatever the scores
  int64_t k = 0;                 // unprotected tokens kept, the best by pooled score
  // The last `rotated_rows` query rows are pre-RoPE (beacons, then any blurred beacon rows):
  // the scorer rotates each of their head_dim vectors to position `rotate_to`
  // (ScoringPlan::rope_theta) before scoring.
  int32_t rotated_rows = 0;
  int32_t rotate_to = 0;
  // An optional reserved region: empty, or [num_tokens()] slot order, 1 = in the region. The
  // first min(reserve_k, k) of the k picks go to the region's best unprotected tokens, the
  // rest to the best of what is left (beacon's prompt_slots).
  std::vector<uint8_t> reserve;
  int64_t reserve_k = 0;

  int32_t num_tokens() const { return static_cast<int32_t>(protect.size()); }  // the head's
};

// A layer's planned compression: how every task of it is scored, and the tasks of the heads
// that must shed tokens (due heads within budget keep everything and have no task).
struct ScoringPlan {
  int32_t layer = 0;
  // True (pooled budgets): the layer's heads share one budget, so every head of the layer is
  // a task and the selection is the policy's: the scorer's scores (before pooling) go back to
  // PolicyState::SelectFromScores, and its keep masks (k = 0) are not used.
  bool pooled = false;
  int32_t group_size = 1;  // query heads per query row
  ScoreSpec spec;          // GQA and query reductions
  Pooling pooling = Pooling::kNone;
  int32_t pool_kernel = 1;
  // True: protected tokens take no part in the scoring (outside every softmax) and pool as
  // the pooling's padding, so they must be the head's newest tokens (snapkv's window).
  bool protected_unscored = false;
  // True (rkv): each token's rank score is lambda * pooled - (1 - lambda) * redundancy, the
  // redundancy (core RedundancyScores) taken over all of the head's keys with
  // `redundancy_threshold` as the near-duplicate cosine.
  bool redundancy = false;
  float lambda = 1.0f;
  float redundancy_threshold = 0.5f;
  // RoPE base of the tasks' rotated rows (0 when no task has any).
  double rope_theta = 0.0;
  std::vector<ScoringTask> tasks;  // ascending kv_head
};

// Builds the keep-sets of `plan` from a scorer's keep masks: keep[t] is task t's [num_tokens()]
// slot-order mask. kInvalidArgument when the masks do not match the plan.
absl::StatusOr<std::vector<KeepSet>> KeepSetsFromMasks(
    const ScoringPlan& plan, absl::Span<const absl::Span<const uint8_t>> keep);

class PolicyState {
 public:
  virtual ~PolicyState() = default;

  virtual std::string_view policy_name() const = 0;
  const PolicyGeometry& geometry() const { return geometry_; }
  int32_t prompt_len() const { return prompt_len_; }

  // True when Observe() needs the head's keys (h2o accumulates attention over them).
  virtual bool NeedsKeysOnObserve() const { return false; }

  // True when Compress may run for different layers at the same time, from different
  // threads (each call given its own layer; no Observe meanwhile). The engine then compresses
  // a sequence's due layers in parallel.
  virtual bool LayersConcurrent() const { return false; }
  // True (with LayersConcurrent) when Compress may also run for different heads of one layer
  // at the same time, each call given its own due head, and a layer's keep-sets are those of
  // its due heads compressed one at a time: no budget or state shared between heads (uniform
  // budgets). The engine then splits a sequence's compressions by head.
  virtual bool HeadsConcurrent() const { return false; }
  // True when Observe may run for different heads at the same time, from different threads
  // (each head's observation state its own). The engine then observes each head inside the
  // attention's parallel region, whose threads each fence their streaming stores
  // (StreamFence) before it ends: a fence the policy issues covers its own thread only.
  virtual bool ObserveConcurrent() const { return false; }

  // Records one step's queries of (layer, kv_head), oldest step first. Prefill positions
  // may be fed too (h2o sums prefill attention; the others keep only what they need).
  // `keys`: the head's cache including this step's own token; required only when
  // NeedsKeysOnObserve(), otherwise may be null. Keys with a position greater than
  // step.position are ignored (causal).
  virtual absl::Status Observe(int32_t layer, int32_t kv_head, const StepQueries& step,
                               const HeadKeys* keys) = 0;

  // The kv_heads of `layer` due for compression (ascending). head_tokens: [num_kv_heads].
  virtual std::vector<int32_t> DueHeads(int32_t layer,
                                        absl::Span<const int32_t> head_tokens) const = 0;

  // Compresses `due` heads of `layer` (ascending kv_head indexes, usually from DueHeads;
  // any subset forces compression). heads: [num_kv_heads], every head's keys; entries of heads
  // not in `due` are read only by per-layer policies (pooled budgets, rpc), which compress
  // every head of the layer. current_position: the newest token's position (beacons are
  // rotated to it). Returns one keep-set per compressed head.
  virtual absl::StatusOr<std::vector<KeepSet>> Compress(int32_t layer,
                                                        absl::Span<const HeadKeys> heads,
                                                        absl::Span<const int32_t> due,
                                                        int32_t current_position) = 0;

  // Plans what Compress(layer, heads, due, current_position) would do for a scorer outside
  // the policy to carry out; heads may come without keys (positions only). Advances the
  // policy state exactly as Compress does (beacon draws), so call one or the other per event.
  // beacon, tova, snapkv and rkv plan (uniform budgets), and beacon with pooled budgets
  // (ScoringPlan::pooled: the scorer scores, SelectFromScores selects). kUnimplemented for
  // policies whose scoring is not the device's (full, streaming, h2o, rpc, snapkv pooled):
  // run Compress for those.
  virtual absl::StatusOr<ScoringPlan> PlanScoring(int32_t layer, absl::Span<const HeadKeys> heads,
                                                  absl::Span<const int32_t> due,
                                                  int32_t current_position);

  // The keep-sets of a pooled plan (ScoringPlan::pooled) from the scorer's scores: scores[t]
  // is task t's [num_tokens()] slot-order scores before pooling, heads the layer's heads
  // (positions; keys may be null) as planned. Returns what Compress would, one keep-set per
  // head of the layer; reads no policy state that PlanScoring advanced. kInvalidArgument when
  // the scores do not match the plan, kUnimplemented for a policy that plans no pooled layer.
  virtual absl::StatusOr<std::vector<KeepSet>> SelectFromScores(
      const ScoringPlan& plan, absl::Span<const HeadKeys> heads,
      absl::Span<const absl::Span<const float>> scores);

  // Bytes of per-sequence state at most: query rings and beacon buffers counted at capacity
  // (they grow as a sequence fills them, core/capped_growth.h), the rest as held now.
  virtual int64_t StateBytes() const = 0;

 protected:
  PolicyState(const PolicyGeometry& geometry, int32_t prompt_len)
      : geometry_(geometry), prompt_len_(prompt_len) {}

  absl::Status CheckHead(int32_t layer, int32_t kv_head) const;
  // need_keys false: positions only (PlanScoring).
  absl::Status CheckKeys(int32_t layer, int32_t kv_head, const HeadKeys& keys,
                         bool need_keys = true) const;
  // Head in range and the step's query pointers set.
  absl::Status CheckStep(int32_t layer, int32_t kv_head, const StepQueries& step) const;
  absl::Status CheckCompressArgs(int32_t layer, absl::Span<const HeadKeys> heads,
                                 absl::Span<const int32_t> due, bool all_heads,
                                 bool need_keys = true) const;
  // The heads a compression covers: `due`, or every head of the layer when pooled (then
  // held in *all, which must outlive the returned span).
  absl::Span<const int32_t> CoveredHeads(bool pooled, absl::Span<const int32_t> due,
                                         std::vector<int32_t>* all) const;

  // What a policy that scores each head on its own (streaming, h2o, tova, snapkv, rkv,
  // beacon) tells CompressScored.
  struct ScoringHooks {
    BudgetMode mode = BudgetMode::kUniform;
    int64_t budget = 0;
    // The head's always-kept tokens, [n] position order; may leave `protect` empty (none).
    absl::FunctionRef<void(int32_t kv_head, const OrderedHead& ordered,
                           std::vector<uint8_t>* protect)>
        protect;
    // scores: [n] position order, zero-filled; called only for a head over budget (every head
    // when pooled), since a head within budget keeps everything. It may mark more tokens of
    // `protect` ([n], position order) kept, once it has their scores (beacon's prompt slots).
    absl::FunctionRef<void(int32_t kv_head, const OrderedHead& ordered, absl::Span<uint8_t> protect,
                           absl::Span<float> scores)>
        score;
  };
  // The one Compress skeleton of those policies: checks the arguments, takes the due heads
  // (every head of the layer when pooled) in position order, asks the hooks for protected
  // tokens and scores, and selects with the shared tie rule (uniform or pooled budgets).
  // need_keys false: the score hook does not read keys (scores handed back by a scorer).
  absl::StatusOr<std::vector<KeepSet>> CompressScored(int32_t layer,
                                                      absl::Span<const HeadKeys> heads,
                                                      absl::Span<const int32_t> due,
                                                      const ScoringHooks& hooks,
                                                      bool need_keys = true) const;

  // What a policy that can hand its scoring to an external scorer tells PlanScored.
  struct PlanHooks {
    int64_t budget = 0;
    ScoringPlan shape;  // group_size, spec, pooling; tasks empty
    // Same as ScoringHooks::protect.
    absl::FunctionRef<void(int32_t kv_head, const OrderedHead& ordered,
                           std::vector<uint8_t>* protect)>
        protect;
    // Writes the head's observation queries ([rows, group_size, head_dim]) into
    // task->queries (and, for rows left before RoPE, task->rotated_rows and rotate_to) and
    // returns rows; may mark more tokens of `protect` (position order, never empty here) that
    // must be kept before any scored one (beacon's coverage sample). A reserved region goes
    // in task->reserve in position order (PlanScored stores it in slot order).
    absl::FunctionRef<int32_t(int32_t kv_head, const OrderedHead& ordered,
                              std::vector<uint8_t>* protect, ScoringTask* task)>
        rows;
    BudgetMode mode = BudgetMode::kUniform;  // pooled: every head of the layer, k = 0
  };
  // The skeleton of PlanScoring: checks the arguments as CompressScored does (keys may be
  // null) and plans each due head over budget in slot order (pooled: every head of the layer,
  // with k = 0 and plan.pooled set).
  absl::StatusOr<ScoringPlan> PlanScored(int32_t layer, absl::Span<const HeadKeys> heads,
                                         absl::Span<const int32_t> due,
                                         const PlanHooks& hooks) const;

  PolicyGeometry geometry_;
  int32_t prompt_len_;
};

// The budget trigger of the scored and windowed policies: a head (uniform budgets) or the
// heads of a layer together (pooled budgets, `pooled`) compressed back to `budget` tokens per
// head (plus the layer's offset, BudgetOf) once they hold that + interval per head. nullopt for
// full and rpc, whose heads have no such cycle (rpc's trigger grows with every compression).
struct HeadTrigger {
  int64_t budget = 0;
  int64_t interval = 1;
  bool pooled = false;
  std::vector<int32_t> layer_offsets;  // beacon's layer_budget_offsets; empty = none
  int64_t BudgetOf(int32_t layer) const { return LayerBudget(budget, layer_offsets, layer); }
  friend bool operator==(const HeadTrigger&, const HeadTrigger&) = default;
};
std::optional<HeadTrigger> BudgetTrigger(const PolicyConfig& config);

// The most blocks of shape.block_size tokens a sequence whose prefill is `prefill_len`
// tokens and which ends by `max_total` tokens ever holds under `config` when the policy runs
// after every decode step, as the engine and the vLLM backend run it: each head holds the
// prefill, one decode token, then at most budget + interval before each compression, and
// never more than the sequence's tokens. Uniform budgets: that many tokens in every head.
// Pooled budgets: the heads of a layer hold that many per head together, split any way
// among them, so each layer is bounded by its tokens plus one partial block per head.
// With per-layer budgets (beacon's layer_budget_offsets) each layer's high point is added,
// an upper bound: the layers need not peak at the same step. nullopt without a BudgetTrigger.
// Admission control reserves it instead of preempting later.
std::optional<int64_t> PeakBlocks(const PolicyConfig& config, const KvShape& shape,
                                  int32_t prefill_len, int64_t max_total);

// Reservation admission by the pool's future high point instead of the sum of every
// sequence's peak: heads of different sequences reach budget + interval at different steps,
// so the pool's demand stays below that sum. One admitted sequence, now:
struct HeadOutlook {
  absl::Span<const int32_t> head_tokens;  // [shape.num_heads_total()] layer-major
  bool compresses_now = false;  // this step is one of its decode steps: the trigger runs after it
  int64_t steps_left = 0;       // decode steps it may still take (to its max length)
};
// Adds to demand[k] the blocks of shape.block_size tokens the sequence holds at step k from
// now: k = 0 now, k >= 1 after the k-th next step's append and before that step's compression
// (the step's high point), nothing once it has ended. Uniform budgets: exact when the policy
// runs after every decode step and the sequence advances one token per step (the engine and
// the vLLM backend, decoding); a step it skips or a prefill in chunks shifts its cycle.
// Pooled budgets: exact until a layer's first compression in the outlook, then an upper
// bound (the layer's tokens are known, their split among its heads is not: PeakBlocks's
// bound). Returns false (demand unchanged) without a BudgetTrigger.
bool AddBlockDemand(const PolicyConfig& config, const KvShape& shape, const HeadOutlook& seq,
                    absl::Span<int64_t> demand);
// The steps of demand that hold its maximum over all time: within budget + interval steps every
// head (every layer, pooled) is in its budget .. budget + interval cycle, which repeats every
// `interval` steps for every sequence under `config`, and a sequence that ends only lowers
// later steps. nullopt without a BudgetTrigger.
std::optional<int64_t> BlockDemandHorizon(const PolicyConfig& config);

// Validates config against a model's geometry (kInvalidArgument with the reason): the config
// on its own (ValidatePolicyConfig), the geometry, and what needs both (one budget offset per
// layer, blurred layers the model has, a head_dim the FPS takes). What NewPolicyState checks
// before creating a state, for callers that know the model before any sequence.
absl::Status ValidatePolicyGeometry(const PolicyConfig& config, const PolicyGeometry& geometry);

// Validates config and geometry (ValidatePolicyGeometry) and prompt_len, and creates the state.
absl::StatusOr<std::unique_ptr<PolicyState>> NewPolicyState(const PolicyConfig& config,
                                                            const PolicyGeometry& geometry,
                                                            int32_t prompt_len);

// Everything needed to run a policy once on one head, e.g. from NumPy.
struct OneHeadInput {
  HeadKeys keys;  // [num_tokens, head_dim] post-RoPE + positions
  int32_t prompt_len = 0;
  int32_t group_size = 1;
  int32_t num_steps = 0;                     // query history length, oldest first
  const float* queries_pre = nullptr;        // [num_steps, group_size, head_dim]
  const float* queries_post = nullptr;       // [num_steps, group_size, head_dim]
  const int32_t* query_positions = nullptr;  // [num_steps]
  int32_t current_position = -1;             // -1: the largest key position
};

// Feeds the query history to a fresh 1-layer, 1-head state and compresses once (forced,
// whatever the trigger says; a head within budget keeps everything). Returns the kept slots,
// ascending.
absl::StatusOr<std::vector<int32_t>> RunPolicyOnHead(const PolicyConfig& config,
                                                     const RopeConfig& rope,
                                                     const OneHeadInput& input);

}  // namespace beaconkv
