// CPU forward pass of a Llama-architecture model (RMSNorm, RoPE, GQA, SwiGLU; optional
// Qwen2 q/k/v biases and Qwen3 q/k norms) over the head-granular paged KV cache.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "block_manager/block_manager.h"
#include "block_manager/kv_store.h"
#include "core/rope.h"
#include "engine/model_weights.h"

namespace beaconkv {

// Receives each token's queries for one (layer, kv_head): pre-RoPE and post-RoPE,
// [group_size, head_dim] each. `row` is the batch index (decode) or the token index (prefill).
using QuerySink = std::function<void(int32_t row, int32_t layer, int32_t kv_head, int32_t position,
                                     const float* pre_rope, const float* post_rope)>;

class ModelRunner {
 public:
  // batch_invariant: every Linear as one fixed-order dot product per output element, so a
  // row's result does not depend on the batch (tests, accuracy runs); otherwise OpenBLAS GEMMs.
  static absl::StatusOr<ModelRunner> Create(ModelWeights weights, int num_threads,
                                            bool batch_invariant = true);

  const ModelConfig& config() const { return weights_.config; }
  int32_t group_size() const { return config().num_heads / config().num_kv_heads; }
  const Rope& rope() const { return rope_; }

  // Runs tokens[i] at position i; writes every layer's post-RoPE K and V of token i into
  // logical slot i of each head of `seq`, which must already hold tokens.size() slots.
  // last_logits: [vocab] of the final token, or null.
  // observe_seconds (optional) accumulates the time spent in `sink`, measured once per layer
  // (a clock read per call would cost as much as a policy's per-step observation).
  absl::Status Prefill(SequenceId seq, absl::Span<const int32_t> tokens, const BlockManager& bm,
                       CpuKvStore& store, const QuerySink* sink, float* last_logits,
                       double* observe_seconds = nullptr) const;

  // One decode step. Row b runs tokens[b] at positions[b] for sequence seqs[b]; its K/V go
  // to slots[b * num_heads_total + head] (from BlockManager::AppendToken), then attention
  // reads every slot of the head, the new one included. logits: [rows, vocab].
  // attention_seconds accumulates time spent in attention, observe_seconds (optional) time
  // spent in `sink` (measured once per layer, as in Prefill). head_bias: empty, or
  // [rows * num_heads_total] spans, each empty (no bias) or one logit term per slot of the
  // head in logical order, the new one included (the count bias, CountBiasLayers).
  // sink_concurrent: `sink` may run for different (row, kv_head) at once. When the layer's
  // attention is split over threads (PagedDecodeAttentionSplits), each head's call then
  // follows its attention on the thread that computed it, inside that region (no region of
  // its own, and the observation split over the threads), and observe_seconds gets the
  // calls' time summed per thread, the largest of those sums (an estimate of their share of
  // its wall time; attention_seconds gets the rest), and layers_observed_in_region (optional)
  // counts the layer. Otherwise the calls run on this thread after the layer's attention. An
  // exception from a call is rethrown here after the region.
  absl::Status Decode(absl::Span<const SequenceId> seqs, absl::Span<const int32_t> tokens,
                      absl::Span<const int32_t> positions, absl::Span<const SlotRef> slots,
                      const BlockManager& bm, CpuKvStore& store, const QuerySink* sink,
                      float* logits, double* attention_seconds, double* observe_seconds = nullptr,
                      absl::Span<const absl::Span<const float>> head_bias = {},
                      bool sink_concurrent = false,
                      int64_t* layers_observed_in_region = nullptr) const;

 private:
  ModelRunner(ModelWeights weights, Rope rope, int num_threads, bool batch_invariant)
      : weights_(std::move(weights)),
        rope_(std::move(rope)),
        num_threads_(num_threads),
        batch_invariant_(batch_invariant) {}

  // y = x w^T (+ bias) by the path this runner was created with.
  void Dense(const float* x, const std::vector<float>& w, const float* bias, int64_t rows,
             int64_t in, int64_t out, float* y) const;

  // q, k, v projections of `rows` normalised rows of one layer, with bias / q-k norms,
  // pre-RoPE q saved to q_pre, then RoPE applied to q and k in place.
  void ProjectQkv(const LayerWeights& lw, const float* h, int64_t rows,
                  absl::Span<const int32_t> positions, float* q, float* q_pre, float* k,
                  float* v) const;
  // Residual MLP block in place on x [rows, hidden].
  void Mlp(const LayerWeights& lw, float* x, int64_t rows) const;
  void Logits(const float* x, int64_t rows, float* logits) const;

  ModelWeights weights_;
  Rope rope_;
  int num_threads_;
  bool batch_invariant_;
};

}  // namespace beaconkv
