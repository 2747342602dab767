// The reference engine: a continuous-batching scheduler with preemption driving the CPU model
// runner over the head-granular paged KV cache, with an eviction policy per sequence.
//
// Each step: swap in (FIFO) what fits, else admit waiting requests (FIFO) whose prompt fits
// above the watermark; make room for every running sequence's next token by preempting the
// most recently admitted ones (recompute or swap); run one decode step for the whole batch;
// run the policy on the heads that reached their trigger and free the blocks it releases,
// which the next admission can use at once; retire finished sequences.
//
// Thread safety: every public method takes an internal mutex, so an Engine may be shared by
// threads; each call is atomic (a RunToCompletion holds the engine until it returns).
// docs/reliability.md.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "block_manager/block_manager.h"
#include "core/policy.h"
#include "engine/count_bias.h"
#include "engine/engine_types.h"
#include "engine/model_runner.h"
#include "kernels/scorer.h"

namespace beaconkv {

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(ModelWeights weights,
                                                        const EngineConfig& config);
  static absl::StatusOr<std::unique_ptr<Engine>> FromModelDir(const std::string& model_dir,
                                                              const EngineConfig& config);

  const ModelConfig& model_config() const { return runner_.config(); }
  const EngineConfig& config() const { return config_; }
  const BlockManager& block_manager() const { return *bm_; }

  // Queues a request. kInvalidArgument for a bad request (empty prompt, unknown token, ids
  // reused, a prompt that can never fit the pool).
  absl::Status AddRequest(Request request);
  // Teacher-forces `tokens` (the first `prompt_len` of them the prompt) through the engine as
  // one sequence, alone, under `policy` instead of the configured one, and returns when the
  // policy evicted each position from each head: the engine's own observe/compress loop, so
  // exactly what a request with these tokens as prompt + forced output does. Every position
  // 0 .. tokens.size()-1 is cached and observed; the step that caches the last one ends the
  // sequence, and the engine does not compress after a sequence's last step.
  // kFailedPrecondition while requests are unfinished; kInvalidArgument for an empty
  // sequence, a prompt_len outside [1, tokens.size()], an unknown token, a sequence longer
  // than max_model_len - 1 or an invalid policy; kResourceExhausted when the pool cannot hold
  // the sequence. Counts in stats() like any request.
  absl::StatusOr<EvictionRecord> ReplayEvictions(absl::Span<const int32_t> tokens,
                                                 int32_t prompt_len, const PolicyConfig& policy);
  // Runs until every queued request is finished; returns them in the order they finished.
  absl::StatusOr<std::vector<RequestOutput>> RunToCompletion();
  // One scheduler step; finished requests are appended to `finished`.
  absl::Status Step(std::vector<RequestOutput>* finished);
  bool HasUnfinished() const;
  EngineStats stats() const;  // a copy, taken under the lock
  int32_t num_running() const;

 private:
  struct EvictionEvent {
    int32_t layer;
    int32_t kv_head;
    int32_t position;
    int32_t step;
  };
  struct SeqState {
    Request request;
    Sampler sampler;
    PolicyConfig policy_config;  // the engine's, or ReplayEvictions' own
    std::unique_ptr<PolicyState> policy;
    RequestOutput out;
    int32_t pending = -1;                  // last output token, its K/V not yet in the cache
    bool in_cache = false;                 // holds blocks (running or swapped)
    int32_t peak_blocks = -1;              // peak blocks (kReserve, bounded policy); -1: none
    std::vector<EvictionEvent> evictions;  // [tokens evicted] when request.record_evictions
    CountBias count_bias;                  // its count-bias terms (CountBiasLayers > 0)
  };

  Engine(const EngineConfig& config, ModelRunner runner, std::unique_ptr<CpuKvStore> store,
         std::unique_ptr<BlockManager> bm);

  absl::Status AddRequestLocked(Request request, const PolicyConfig& policy);
  absl::Status StepLocked(std::vector<RequestOutput>* finished);
  bool HasUnfinishedLocked() const {
    return !waiting_.empty() || !running_.empty() || !swapped_.empty();
  }
  absl::Status Admit(SeqState& s);
  absl::Status Preempt(int64_t id);
  absl::Status DecodeStep(std::vector<RequestOutput>* finished);
  // The keep-sets of every sequence of `ids` (HostKeepSets, one region on num_threads threads;
  // with a scorer, ScoredKeepSets: every planned head of the step in one scorer call), then
  // ApplyCompression for each in turn, stopping at the first error (every sequence's policy
  // has advanced by then, applied or not: an error here is an engine bug, and the step fails).
  absl::Status Compress(absl::Span<const int64_t> ids);
  // ApplyKeepSets (every compressed layer of one sequence) plus the statistics and eviction
  // record.
  absl::Status ApplyCompression(SeqState& s, absl::Span<const KeepSet> keep, int32_t current);
  // The count bias of row b's heads in its first `layers` layers (its count-bias layers;
  // ModelRunner::Decode's head_bias), position = the token being decoded.
  absl::Status AddCountBias(SeqState& s, int32_t position, int32_t layers, int64_t b,
                            std::vector<absl::Span<const float>>* head_bias);
  // The token at `position` of s (prompt, then output; every position up to the newest).
  static int32_t TokenAt(const SeqState& s, int32_t position);
  void Observe(SeqState& s, int32_t layer, int32_t kv_head, int32_t position, const float* pre,
               const float* post);
  // Appends to s.evictions the positions of `positions` (one head's, slot order) that
  // `kept.slots` (ascending) drops.
  static void RecordEvictions(SeqState& s, const KeepSet& kept, absl::Span<const int32_t> positions,
                              int32_t step);
  // s.evictions as the dense record of RequestOutput::evictions.
  EvictionRecord BuildEvictionRecord(const SeqState& s) const;
  // Records the sampled/forced token; returns true when the request is finished.
  bool Accept(SeqState& s, absl::Span<const float> logits);
  void Finish(int64_t id, std::vector<RequestOutput>* finished);
  int32_t PromptBlocks(int64_t tokens) const;
  // Most device blocks `s` holds once prefilled with `prefill_len` tokens (core PeakBlocks,
  // capped by the request's end); -1 when unbounded.
  int32_t PeakBlocks(const SeqState& s, int64_t prefill_len) const;
  // Reservation admission (kReserve, others running; no swapped sequence waits): whether `s`,
  // prefilled with `prefill_len` tokens, fits beside the running sequences at every coming
  // step. Sequences under s's budget trigger follow their heads' cycles (AddBlockDemand), so
  // their peaks need not coincide; any other running sequence counts at its peak every step
  // (at what it holds when unbounded), an upper bound of its own path.
  bool ReservationFits(const SeqState& s, int64_t prefill_len) const;
  // Decode steps (appends) `s` may still take: to its end (max_new_tokens, forced output,
  // max_model_len), counted from its outputs so far.
  int64_t DecodeStepsLeft(const SeqState& s) const;
  void UpdateMemoryStats();
  // Folds `s`'s current blocks and retained tokens into its peak statistics.
  void UpdatePeak(SeqState& s);

  EngineConfig config_;
  ModelRunner runner_;
  std::unique_ptr<CpuKvStore> store_;
  std::unique_ptr<BlockManager> bm_;
  std::unique_ptr<Scorer> scorer_;  // config_.scorer == kPaged
  absl::flat_hash_map<int64_t, std::unique_ptr<SeqState>> seqs_;
  std::deque<int64_t> waiting_;
  std::vector<int64_t> running_;  // admission order: the back is preempted first
  std::deque<int64_t> swapped_;
  EngineStats stats_;
  absl::Status observe_status_;  // first policy Observe error of the current step
  std::mutex observe_mu_;        // guards observe_status_ while heads are observed at once
  double running_sum_ = 0;
  double used_blocks_sum_ = 0;  // device blocks in use at each decode step's forward pass
  int64_t decode_steps_ = 0;
  mutable std::mutex mu_;  // taken by every public method; never re-entered
};

}  // namespace beaconkv
