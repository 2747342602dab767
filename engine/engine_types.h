// Requests, results and statistics of the reference engine.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/policy_config.h"
#include "engine/sampler.h"

namespace beaconkv {

enum class PreemptionMode { kRecompute, kSwap };

// kOptimistic: admit a request when its prompt fits now (vLLM's rule), preempt when the pool
// runs short. kReserve: when the policy has a budget trigger (core PeakBlocks: uniform or
// pooled budgets), admit a request only when its peak fits beside what the admitted sequences
// may still grow into, so such policies never preempt; unbounded policies (full, rpc) stay
// optimistic.
enum class AdmissionMode { kOptimistic, kReserve };

// Where a compression event's scoring and selection run. kHost: the policy's own Compress
// (position order, the reference). kPaged: the policy plans (PlanScoring) and the device
// pipeline's CPU twin (kernels/scorer.h) scores every due head of the step through its block
// table in one call, as the GPU would; policies without a plan (full, streaming, h2o, rpc,
// pooled budgets) still run Compress. Same keep-sets up to the scores' rounding.
enum class ScorerKind { kHost, kPaged };

struct EngineConfig {
  int32_t block_size = 16;
  // Device pool size counting the null block. 0: room for max_batch sequences of
  // max_model_len tokens in every head (no memory pressure).
  int32_t num_blocks = 0;
  int32_t num_host_blocks = 0;   // swap space; 0 = as many as num_blocks (swap mode)
  int32_t max_batch = 32;        // most sequences running at once
  int32_t watermark_blocks = 0;  // free blocks an admission must leave
  PreemptionMode preemption = PreemptionMode::kRecompute;
  AdmissionMode admission = AdmissionMode::kOptimistic;
  PolicyConfig policy = FullConfig{};
  int32_t num_threads = 2;
  // Every Linear as fixed-order dot products: a sequence's tokens do not depend on what it is
  // batched with, and swap/recompute reproduce an unpreempted run exactly. Off: OpenBLAS
  // GEMMs, faster as the batch grows (1.2-1.7x at batch 8-64 on the tiny model, docs/engine.md),
  // equal up to float rounding.
  bool batch_invariant = true;
  int32_t max_model_len = 0;      // 0 = the model's max_position_embeddings
  int32_t eos_token_id = -1;      // -1: from the tokenizer (FromModelDir) / never stop on eos
  bool verify_integrity = false;  // VerifyIntegrity() after every step (tests)
  ScorerKind scorer = ScorerKind::kHost;
  bool allow_nonfinite_weights = false;  // FromModelDir: NaN/Inf weights warn instead of fail
};

struct Request {
  int64_t id = 0;
  std::vector<int32_t> prompt;  // token ids, bos included
  SamplingParams sampling;
  // Teacher forcing: when not empty, these tokens are fed instead of sampled ones and the
  // request ends after the last; logits are recorded for every fed position.
  std::vector<int32_t> forced_output;
  bool return_logits = false;  // record [num_output, vocab] logits
  // Record the step at which the policy evicted each cached position from each head
  // (RequestOutput::evictions).
  bool record_evictions = false;
};

// The eviction step of a position that was never evicted (it is still cached at the end).
inline constexpr int64_t kNeverEvicted = std::numeric_limits<int64_t>::max();

// When each position left each head of one sequence. Step t is the decode step that cached
// position t: a position "evicted at t" was read by the query at t and by none after it.
// A recompute preemption drops the cache and the policy's memory, so the record restarts
// with the re-admission.
struct EvictionRecord {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t num_positions = 0;  // positions the sequence cached: prompt + output - 1
  // [num_layers, num_kv_heads, num_positions] eviction step, kNeverEvicted if kept to the end
  std::vector<int64_t> evicted_at;
  int64_t first_step = kNeverEvicted;  // the earliest eviction step, kNeverEvicted if none
};

// Why a request ended; kRunning until it has.
enum class FinishReason { kRunning, kEos, kLength, kForced, kMaxModelLen, kOutOfMemory };

// "running", "eos", "length", "forced", "max_model_len", "out_of_memory".
inline std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kRunning:
      return "running";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kForced:
      return "forced";
    case FinishReason::kMaxModelLen:
      return "max_model_len";
    case FinishReason::kOutOfMemory:
      return "out_of_memory";
  }
  return "?";
}

struct RequestOutput {
  int64_t id = 0;
  int32_t prompt_len = 0;
  std::vector<int32_t> output;  // generated (or forced) tokens
  std::vector<float>
      logits;  // [output.size(), vocab] when requested: logits[i] predicted output[i]
  FinishReason finish_reason = FinishReason::kRunning;
  double peak_retained_tokens = 0;  // max over steps of the mean tokens per head
  int32_t peak_blocks = 0;          // max over steps of the blocks the sequence held
  int32_t num_preemptions = 0;
  int64_t tokens_evicted = 0;
  EvictionRecord evictions;  // when Request::record_evictions; empty otherwise
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;  // including recompute re-prefills
  int64_t generated_tokens = 0;
  double wall_seconds = 0;
  int32_t peak_running = 0;
  double mean_running = 0;      // over decode steps
  double mean_used_blocks = 0;  // over decode steps, at the forward pass (before eviction)
  int32_t peak_used_blocks = 0;
  int64_t preemptions_recompute = 0;
  int64_t preemptions_swap = 0;
  int64_t compressions = 0;  // (sequence, layer) compression events
  int64_t tokens_evicted = 0;
  int64_t blocks_freed_by_eviction = 0;
  // Decode layers whose observations ran inside the attention's threads (ModelRunner::Decode,
  // sink_concurrent), one per (step, layer).
  int64_t layers_observed_in_attention = 0;
  // Time split (seconds).
  double time_prefill = 0;
  double time_decode_forward = 0;  // includes attention
  double time_attention = 0;
  double time_scoring = 0;      // policy Observe: query buffers, accumulators, FPS
  double time_selection = 0;    // policy Compress: key gather, scores, top-k
  double time_compaction = 0;   // ApplyKeepSets
  double time_bookkeeping = 0;  // block allocation, scheduling

  std::string ToJson() const;
};

}  // namespace beaconkv
