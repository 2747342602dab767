// full, streaming, tova and h2o: the policies that need no observation window.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "core/policy_internal.h"
#include "core/selection.h"
#include "core/status_macros.h"

namespace beaconkv::internal {
namespace {

// ---------------------------------------------------------------------------------------
class FullState final : public PolicyState {
 public:
  FullState(const PolicyGeometry& g, int32_t prompt_len) : PolicyState(g, prompt_len) {}
  std::string_view policy_name() const override { return "full"; }
  absl::Status Observe(int32_t layer, int32_t kv_head, const StepQueries&,
                       const HeadKeys*) override {
    return CheckHead(layer, kv_head);
  }
  std::vector<int32_t> DueHeads(int32_t, absl::Span<const int32_t>) const override { return {}; }
  absl::StatusOr<std::vector<KeepSet>> Compress(int32_t layer, absl::Span<const HeadKeys> heads,
                                                absl::Span<const int32_t> due, int32_t) override {
    BKV_RETURN_IF_ERROR(CheckCompressArgs(layer, heads, due, false));
    std::vector<KeepSet> out;
    for (int32_t h : due) {
      KeepSet k{layer, h, std::vector<int32_t>(heads[h].num_tokens)};
      std::iota(k.slots.begin(), k.slots.end(), 0);
      out.push_back(std::move(k));
    }
    return out;
  }
  int64_t StateBytes() const override { return 0; }
};

// ---------------------------------------------------------------------------------------
class StreamingState final : public PolicyState {
 public:
  StreamingState(const StreamingConfig& c, const PolicyGeometry& g, int32_t prompt_len)
      : PolicyState(g, prompt_len), config_(c) {}
  std::string_view policy_name() const override { return "streaming"; }
  absl::Status Observe(int32_t layer, int32_t kv_head, const StepQueries&,
                       const HeadKeys*) override {
    return CheckHead(layer, kv_head);
  }
  std::vector<int32_t> DueHeads(int32_t, absl::Span<const int32_t> tokens) const override {
    return DueOverBudget(BudgetMode::kUniform, tokens, config_.budget, config_.interval);
  }
  // A position rule: the sinks and the newest tokens are protected and fill the budget.
  absl::StatusOr<std::vector<KeepSet>> Compress(int32_t layer, absl::Span<const HeadKeys> heads,
                                                absl::Span<const int32_t> due, int32_t) override {
    return CompressScored(
        layer, heads, due,
        {BudgetMode::kUniform, config_.budget,
         [&](int32_t, const OrderedHead& ordered, std::vector<uint8_t>* protect) {
           const int32_t n = ordered.size();
           protect->assign(n, 0);
           for (int32_t i = 0; i < std::min(config_.n_sinks, n); ++i) (*protect)[i] = 1;
           for (int32_t i = std::max(n - (config_.budget - config_.n_sinks), 0); i < n; ++i) {
             (*protect)[i] = 1;
           }
         },
         [](int32_t, const OrderedHead&, absl::Span<uint8_t>, absl::Span<float>) {}});
  }
  int64_t StateBytes() const override { return 0; }

 private:
  StreamingConfig config_;
};

// ---------------------------------------------------------------------------------------
class TovaState final : public PolicyState {
 public:
  TovaState(const TovaConfig& c, const PolicyGeometry& g, int32_t prompt_len)
      : PolicyState(g, prompt_len), config_(c) {
    last_.assign(g.num_heads_total(), QueryRing(1, g.group_size * g.head_dim()));
  }
  std::string_view policy_name() const override { return "tova"; }
  absl::Status Observe(int32_t layer, int32_t kv_head, const StepQueries& step,
                       const HeadKeys*) override {
    BKV_RETURN_IF_ERROR(CheckStep(layer, kv_head, step));
    last_[geometry_.HeadIndex(layer, kv_head)].Push(step.post_rope);
    return absl::OkStatus();
  }
  std::vector<int32_t> DueHeads(int32_t, absl::Span<const int32_t> tokens) const override {
    return DueOverBudget(BudgetMode::kUniform, tokens, config_.budget, config_.interval);
  }
  absl::StatusOr<std::vector<KeepSet>> Compress(int32_t layer, absl::Span<const HeadKeys> heads,
                                                absl::Span<const int32_t> due, int32_t) override {
    const int32_t d = geometry_.head_dim();
    const int32_t g = geometry_.group_size;
    std::vector<float> q(static_cast<size_t>(g) * d);
    ScoreScratch scratch;
    return CompressScored(
        layer, heads, due,
        {BudgetMode::kUniform, config_.budget,
         [](int32_t, const OrderedHead&, std::vector<uint8_t>*) {},
         [&](int32_t h, const OrderedHead& ordered, absl::Span<uint8_t>, absl::Span<float> scores) {
           const QueryRing& ring = last_[geometry_.HeadIndex(layer, h)];
           if (ring.size() != 1) return;
           ring.CopyOrdered(q.data());
           AttentionScores(ordered.keys(), 0, ordered.size(), d, q.data(), 1, g,
                           {GqaReduction::kMeanProbs, QueryReduction::kMax}, scores.data(),
                           &scratch);
         }});
  }
  // The same selection for an external scorer: the newest step's queries (one row of the
  // whole group, softmax per query head, mean over the group), nothing protected.
  absl::StatusOr<ScoringPlan> PlanScoring(int32_t layer, absl::Span<const HeadKeys> heads,
                                          absl::Span<const int32_t> due, int32_t) override {
    ScoringPlan shape;
    shape.group_size = geometry_.group_size;
    shape.spec = {GqaReduction::kMeanProbs, QueryReduction::kMax};
    return PlanScored(
        layer, heads, due,
        {config_.budget, std::move(shape),
         [](int32_t, const OrderedHead&, std::vector<uint8_t>*) {},
         [&](int32_t h, const OrderedHead&, std::vector<uint8_t>*, ScoringTask* task) {
           return last_[geometry_.HeadIndex(layer, h)].CopyOrdered(&task->queries);
         }});
  }

  int64_t StateBytes() const override {
    int64_t b = 0;
    for (const QueryRing& r : last_) b += r.Bytes();
    return b;
  }

 private:
  TovaConfig config_;
  std::vector<QueryRing> last_;  // [num_heads_total], newest step's post-RoPE queries
};

// ---------------------------------------------------------------------------------------
class H2OState final : public PolicyState {
 public:
  H2OState(const H2OConfig& c, const PolicyGeometry& g, int32_t prompt_len)
      : PolicyState(g, prompt_len), config_(c), acc_(g.num_heads_total()) {}
  std::string_view policy_name() const override { return "h2o"; }
  bool NeedsKeysOnObserve() const override { return true; }

  absl::Status Observe(int32_t layer, int32_t kv_head, const StepQueries& step,
                       const HeadKeys* keys) override {
    BKV_RETURN_IF_ERROR(CheckStep(layer, kv_head, step));
    if (keys == nullptr) {
      return absl::InvalidArgumentError(
          "policy h2o: Observe needs the head's keys (it accumulates attention)");
    }
    BKV_RETURN_IF_ERROR(CheckKeys(layer, kv_head, *keys));
    const int32_t n = keys->num_tokens;
    if (n == 0) return absl::OkStatus();
    const int32_t d = geometry_.head_dim();
    const int32_t g = geometry_.group_size;
    logits_.resize(static_cast<size_t>(g) * n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g, n, d,
                1.0f / std::sqrt(static_cast<float>(d)), step.post_rope, d, keys->keys, d, 0.0f,
                logits_.data(), n);
    // Causal: keys after the query's own position do not exist yet for it.
    visible_.clear();
    for (int32_t j = 0; j < n; ++j) {
      if (keys->positions[j] <= step.position) visible_.push_back(j);
    }
    if (visible_.empty()) return absl::OkStatus();
    row_.resize(visible_.size());
    absl::flat_hash_map<int32_t, float>& acc = acc_[geometry_.HeadIndex(layer, kv_head)];
    for (int32_t h = 0; h < g; ++h) {
      const float* l = logits_.data() + static_cast<size_t>(h) * n;
      for (size_t v = 0; v < visible_.size(); ++v) row_[v] = l[visible_[v]];
      SoftmaxInPlace(row_.data(), static_cast<int32_t>(row_.size()));
      for (size_t v = 0; v < visible_.size(); ++v) acc[keys->positions[visible_[v]]] += row_[v];
    }
    return absl::OkStatus();
  }

  std::vector<int32_t> DueHeads(int32_t, absl::Span<const int32_t> tokens) const override {
    return DueOverBudget(BudgetMode::kUniform, tokens, config_.budget, config_.interval);
  }

  absl::StatusOr<std::vector<KeepSet>> Compress(int32_t layer, absl::Span<const HeadKeys> heads,
                                                absl::Span<const int32_t> due, int32_t) override {
    const int32_t recent =
        static_cast<int32_t>(std::floor(config_.budget * config_.recent_fraction));
    BKV_ASSIGN_OR_RETURN(
        std::vector<KeepSet> keep,
        CompressScored(layer, heads, due,
                       {BudgetMode::kUniform, config_.budget,
                        [&](int32_t, const OrderedHead& ordered, std::vector<uint8_t>* protect) {
                          const int32_t n = ordered.size();
                          protect->assign(n, 0);
                          for (int32_t i = std::max(n - recent, 0); i < n; ++i) (*protect)[i] = 1;
                        },
                        [&](int32_t h, const OrderedHead& ordered, absl::Span<uint8_t>,
                            absl::Span<float> scores) {
                          const auto& acc = acc_[geometry_.HeadIndex(layer, h)];
                          for (int32_t i = 0; i < ordered.size(); ++i) {
                            auto it = acc.find(ordered.positions()[i]);
                            if (it != acc.end()) scores[i] = it->second;
                          }
                        }}));
    // Scores of evicted tokens are dropped.
    for (const KeepSet& k : keep) {
      absl::flat_hash_map<int32_t, float>& acc = acc_[geometry_.HeadIndex(layer, k.kv_head)];
      absl::flat_hash_map<int32_t, float> kept;
      kept.reserve(k.slots.size());
      for (int32_t slot : k.slots) {
        auto it = acc.find(heads[k.kv_head].positions[slot]);
        if (it != acc.end()) kept.emplace(it->first, it->second);
      }
      acc = std::move(kept);
    }
    return keep;
  }

  int64_t StateBytes() const override {
    int64_t b = 0;
    for (const auto& m : acc_) {
      b += static_cast<int64_t>(m.capacity() * (sizeof(int32_t) + sizeof(float) + 1));
    }
    return b;
  }

 private:
  H2OConfig config_;
  std::vector<absl::flat_hash_map<int32_t, float>> acc_;  // [num_heads_total]: pos -> score
  std::vector<float> logits_;                             // [group_size, num_tokens] scratch
  std::vector<float> row_;                                // [visible] scratch
  std::vector<int32_t> visible_;                          // [visible] scratch
};

}  // namespace

std::unique_ptr<PolicyState> NewFullState(const PolicyGeometry& g, int32_t prompt_len) {
  return std::make_unique<FullState>(g, prompt_len);
}
std::unique_ptr<PolicyState> NewStreamingState(const StreamingConfig& c, const PolicyGeometry& g,
                                               int32_t prompt_len) {
  return std::make_unique<StreamingState>(c, g, prompt_len);
}
std::unique_ptr<PolicyState> NewTovaState(const TovaConfig& c, const PolicyGeometry& g,
                                          int32_t prompt_len) {
  return std::make_unique<TovaState>(c, g, prompt_len);
}
std::unique_ptr<PolicyState> NewH2OState(const H2OConfig& c, const PolicyGeometry& g,
                                         int32_t prompt_len) {
  return std::make_unique<H2OState>(c, g, prompt_len);
}

}  // namespace beaconkv::internal
