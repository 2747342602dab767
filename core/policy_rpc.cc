// rpc: Reasoning Path Compression. One token set per layer: the selector queries' attention
// is summed over queries, averaged over every query head of the layer, avg-pooled, and the
// top k * (period / ratio) generated tokens survive the k-th compression.
#include <algorithm>
#include <memory>

#include "absl/strings/str_format.h"
#include "core/policy_internal.h"
#include "core/selection.h"
#include "core/status_macros.h"

namespace beaconkv::internal {
namespace {

class RpcState final : public PolicyState {
 public:
  RpcState(const RpcConfig& c, const PolicyGeometry& g, int32_t prompt_len)
      : PolicyState(g, prompt_len), config_(c), num_compressions_(g.num_layers, 0) {
    rings_.assign(g.num_heads_total(), QueryRing(c.window, g.group_size * g.head_dim()));
  }

  std::string_view policy_name() const override { return "rpc"; }

  absl::Status Observe(int32_t layer, int32_t kv_head, const StepQueries& step,
                       const HeadKeys*) override {
    BKV_RETURN_IF_ERROR(CheckStep(layer, kv_head, step));
    rings_[geometry_.HeadIndex(layer, kv_head)].Push(step.post_rope);
    return absl::OkStatus();
  }

  // (64 bits: period has no upper bound, and the target grows with every compression.)
  int64_t KeepTarget(int32_t layer) const {
    return (int64_t{num_compressions_[layer]} + 1) * (config_.period / config_.ratio);
  }

  // Fires once `period` new tokens have accumulated beyond prompt + kept + window.
  std::vector<int32_t> DueHeads(int32_t layer, absl::Span<const int32_t> tokens) const override {
    if (layer < 0 || layer >= geometry_.num_layers || tokens.empty()) return {};
    const int64_t kept = int64_t{num_compressions_[layer]} * (config_.period / config_.ratio);
    const int64_t threshold = int64_t{prompt_len_} + kept + config_.window + config_.period;
    const int32_t most = *std::max_element(tokens.begin(), tokens.end());
    std::vector<int32_t> due;
    if (most >= threshold) {
      for (size_t h = 0; h < tokens.size(); ++h) due.push_back(static_cast<int32_t>(h));
    }
    return due;
  }

  absl::StatusOr<std::vector<KeepSet>> Compress(int32_t layer, absl::Span<const HeadKeys> heads,
                                                absl::Span<const int32_t> due, int32_t) override {
    BKV_RETURN_IF_ERROR(CheckCompressArgs(layer, heads, due, true));
    const int32_t d = geometry_.head_dim();
    const int32_t g = geometry_.group_size;
    const int32_t num_kv = geometry_.num_kv_heads;
    std::vector<std::unique_ptr<OrderedHead>> ordered;
    for (int32_t h = 0; h < num_kv; ++h) {
      ordered.push_back(std::make_unique<OrderedHead>(heads[h], d));
      if (h > 0 &&
          !std::equal(ordered[h]->positions(), ordered[h]->positions() + ordered[h]->size(),
                      ordered[0]->positions(), ordered[0]->positions() + ordered[0]->size())) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "policy rpc: layer %d: kv heads 0 and %d hold different tokens; rpc keeps one "
            "token set per layer",
            layer, h));
      }
    }
    const int32_t n = ordered[0]->size();
    const int32_t prompt = CountPrompt(*ordered[0], prompt_len_);
    const int32_t gen_end = std::max(prompt, n - config_.window);
    const int32_t region = gen_end - prompt;
    std::vector<float> layer_scores(std::max(region, 0), 0.0f);  // [region]
    if (region > KeepTarget(layer)) {
      std::vector<float> head_scores(region);
      for (int32_t h = 0; h < num_kv; ++h) {
        const QueryRing& ring = rings_[geometry_.HeadIndex(layer, h)];
        queries_.resize(static_cast<size_t>(std::max(ring.size(), 1)) * g * d);
        ring.CopyOrdered(queries_.data());
        AttentionScores(ordered[h]->keys(), prompt, gen_end, d, queries_.data(), ring.size(), g,
                        {GqaReduction::kMeanProbs, QueryReduction::kSum}, head_scores.data(),
                        &scratch_);
        for (int32_t i = 0; i < region; ++i) layer_scores[i] += head_scores[i] / num_kv;
      }
      Pool1d(config_.pooling, config_.pool_kernel, absl::MakeSpan(layer_scores));
    }
    // One selection for the whole layer, applied to every head.
    std::vector<uint8_t> protect(n, 1);
    std::vector<float> scores(n, 0.0f);
    for (int32_t i = prompt; i < gen_end; ++i) {
      protect[i] = 0;
      scores[i] = layer_scores[i - prompt];
    }
    const std::vector<int32_t> chosen = TopKUnprotected(
        {absl::MakeConstSpan(ordered[0]->positions(), n), protect, scores}, KeepTarget(layer));
    std::vector<int32_t> idx(chosen);
    for (int32_t i = 0; i < n; ++i) {
      if (protect[i]) idx.push_back(i);
    }
    std::sort(idx.begin(), idx.end());
    std::vector<KeepSet> out;
    for (int32_t h = 0; h < num_kv; ++h) out.push_back(ToKeepSet(layer, h, *ordered[h], idx));
    ++num_compressions_[layer];
    return out;
  }

  int64_t StateBytes() const override {
    int64_t b = static_cast<int64_t>(num_compressions_.size() * sizeof(int32_t));
    for (const QueryRing& r : rings_) b += r.Bytes();
    return b;
  }

 private:
  RpcConfig config_;
  std::vector<int32_t> num_compressions_;  // [num_layers]
  std::vector<QueryRing> rings_;           // [num_heads_total], newest `window` post-RoPE steps
  std::vector<float> queries_;             // [window, group_size, head_dim] scratch
  ScoreScratch scratch_;
};

}  // namespace

std::unique_ptr<PolicyState> NewRpcState(const RpcConfig& c, const PolicyGeometry& g,
                                         int32_t prompt_len) {
  return std::make_unique<RpcState>(c, g, prompt_len);
}

}  // namespace beaconkv::internal
